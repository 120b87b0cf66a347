/* monsoon's /usr/local/bin/pause for chaos-daemon: stop until SIGCONT, then become the command.
 * chaos-daemon starts `pause CMD ARGS...`, moves the process into the target container's cgroups while its
 * name is still "pause", then sends SIGCONT until /proc/PID/comm changes: so CMD runs (and allocates) only
 * inside the target's cgroups. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pause CMD [ARGS...]\n");
        return 2;
    }
    raise(SIGSTOP);
    execvp(argv[1], argv + 1);
    fprintf(stderr, "pause: exec %s: %s\n", argv[1], strerror(errno));
    return 127;
}
