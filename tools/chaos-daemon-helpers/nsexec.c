/* monsoon's /usr/local/bin/nsexec for chaos-daemon: `nsexec [-l] [-m|-i|-n|-p PATH]... -- CMD ARGS...`
 * joins the namespaces named by the /proc/PID/ns/X paths, then runs CMD as its child (a joined PID namespace
 * applies to children only), forwards SIGTERM/SIGINT/SIGHUP to it and exits with its status.
 * -l (keep the local mount namespace) is accepted: without -m nothing else changes. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t child = -1;

static void forward(int sig) {
    if (child > 0) kill(child, sig);
}

static int join(const char *path, int type) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "nsexec: open %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (setns(fd, type) != 0) {
        fprintf(stderr, "nsexec: setns %s: %s\n", path, strerror(errno));
        close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

int main(int argc, char **argv) {
    int i = 1;
    /* the mount namespace last: the other paths are read through this one's /proc */
    const char *mnt = NULL;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) { i++; break; }
        if (strcmp(a, "-l") == 0) continue;
        if (a[0] != '-' || a[1] == 0 || a[2] != 0 || i + 1 >= argc) {
            fprintf(stderr, "nsexec: bad argument %s\n", a);
            return 2;
        }
        const char *path = argv[++i];
        int type;
        switch (a[1]) {
        case 'm': mnt = path; continue;
        case 'i': type = CLONE_NEWIPC; break;
        case 'n': type = CLONE_NEWNET; break;
        case 'p': type = CLONE_NEWPID; break;
        default:
            fprintf(stderr, "nsexec: unsupported namespace option %s\n", a);
            return 2;
        }
        if (join(path, type) != 0) return 1;
    }
    if (mnt && join(mnt, CLONE_NEWNS) != 0) return 1;
    if (i >= argc) {
        fprintf(stderr, "nsexec: no command after --\n");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    child = fork();
    if (child < 0) {
        perror("nsexec: fork");
        return 1;
    }
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp(argv[i], argv + i);
        fprintf(stderr, "nsexec: exec %s: %s\n", argv[i], strerror(errno));
        _exit(127);
    }
    int st;
    while (waitpid(child, &st, 0) < 0) {
        if (errno != EINTR) {
            perror("nsexec: waitpid");
            return 1;
        }
    }
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}
