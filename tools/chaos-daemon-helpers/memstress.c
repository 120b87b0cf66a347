/* monsoon's memStress for chaos-daemon's StressChaos memory stressor:
 *   memStress --workers N --size SIZE [--time D] [other options ignored]
 * allocates SIZE per worker (bytes; B/KB/MB/GB, KiB/MiB/GiB, or PERCENT% of MemTotal), writes every page so the
 * memory is charged to the cgroup it runs in, says so on stderr, and holds it until SIGTERM/SIGINT. */
#include <ctype.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void quit(int sig) { (void)sig; stop = 1; }

static unsigned long long mem_total(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    char line[256];
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024ULL;
}

static long long parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    while (isspace((unsigned char)*end)) end++;
    if (*end == '%') return (long long)(v / 100.0 * (double)mem_total());
    struct { const char *u; double m; } units[] = {
        {"", 1}, {"b", 1}, {"k", 1e3}, {"kb", 1e3}, {"m", 1e6}, {"mb", 1e6}, {"g", 1e9}, {"gb", 1e9},
        {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].u) == 0) return (long long)(v * units[i].m);
    return -1;
}

int main(int argc, char **argv) {
    long workers = 1;
    long long size = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc) workers = strtol(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) size = parse_size(argv[++i]);
        else if (strncmp(argv[i], "--", 2) == 0 && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) i++;
    }
    if (size < 0) size = (long long)mem_total();      /* upstream's default: the total memory */
    if (workers < 1 || size <= 0) {
        fprintf(stderr, "memStress: bad --workers/--size\n");
        return 2;
    }
    signal(SIGTERM, quit);
    signal(SIGINT, quit);
    long page = sysconf(_SC_PAGESIZE);
    unsigned long long touched = 0;
    for (long w = 0; w < workers && !stop; w++) {
        char *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("memStress: mmap");
            return 1;
        }
        for (long long off = 0; off < size && !stop; off += page) {
            p[off] = 1;
            touched += (unsigned long long)page;
        }
    }
    fprintf(stderr, "memStress: %ld worker(s) hold %llu bytes\n", workers, touched);
    while (!stop) pause();
    return 0;
}
