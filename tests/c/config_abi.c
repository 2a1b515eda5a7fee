/* ork_config's rules, in a process of its own (no context created before the checks):
 * 1. Reading the configuration starts no thread: ork_config_default counts the cores without
 *    starting the library's pool (/proc/self/task before and after).
 * Exit status 0 only if every check passed. */
#define _DEFAULT_SOURCE
#include "ork_moe.h"

#include <dirent.h>
#include <stdio.h>

static int failures = 0;

#define CHECK(cond, ...)                                                                            \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            failures++;                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                    \
            fprintf(stderr, __VA_ARGS__);                                                           \
            fprintf(stderr, "\n");                                                                  \
        }                                                                                           \
    } while (0)

static int threads_of_this_process(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

int main(void) {
    int before = threads_of_this_process();
    ork_config full;
    ork_config_default(&full);
    int after = threads_of_this_process();
    CHECK(before > 0 && after == before, "ork_config_default: %d threads, then %d", before, after);
    printf("config: ork_config_default started no thread\n");
    if (failures) {
        printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    printf("config: all checks passed\n");
    return 0;
}
