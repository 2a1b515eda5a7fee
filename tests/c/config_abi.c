/* ork_config's size rules, in a process of its own (no context created before the checks):
 * 1. Reading the configuration starts no thread: ork_config_default counts the cores without
 *    starting the library's pool (/proc/self/task before and after).
 * 2. ork_config_default writes exactly struct_size bytes: a short struct placed at the end of a page
 *    followed by a PROT_NONE page gets the defaults of a whole struct in its fields (a write past it
 *    faults); 0 stands for ABI 1's smallest struct (through cache_verify); 1..7 write nothing.
 * 3. ork_ctx_new reads no more than struct_size either.
 * Exit status 0 only if every check passed. */
#define _DEFAULT_SOURCE
#include "ork_moe.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* Every field of ork_config, in order. */
#define FIELDS(X)                                                                                   \
    X(struct_size) X(backend) X(core_mask) X(cache_bytes) X(min_rows) X(n_threads) X(min_rows_mode) \
    X(cache_verify) X(mt_mode) X(emu_submit_us) X(emu_task_us) X(emu_core_tops) X(emu_dram_gbps)     \
    X(rknn_lib) X(emu_dump_dir) X(simd) X(log_level) X(emu_strict) X(emu_per_task) X(cache_policy)  \
    X(outlier_max) X(outlier_factor) X(submitters) X(emu_faults) X(rknn_dynamic_m)                 \
    X(prefetch_threads) X(prefetch_bytes) X(dense) X(dispatch) X(emu_slow_us)

static int threads_of_this_process(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The fields of `got` that end within its first `n` bytes hold `want`'s values, but struct_size,
 * which holds `n`. */
static void same_prefix(const ork_config *got, const ork_config *want, size_t n) {
    CHECK(got->struct_size == n, "struct_size %u after writing %zu bytes", got->struct_size, n);
#define SAME(f)                                                                                     \
    if (offsetof(ork_config, f) + sizeof got->f <= n && strcmp(#f, "struct_size") != 0)              \
        CHECK(memcmp(&got->f, &want->f, sizeof got->f) == 0, "struct_size %zu: " #f " differs", n);
    FIELDS(SAME)
#undef SAME
}

int main(void) {
    int before = threads_of_this_process();
    ork_config full = {.struct_size = sizeof(ork_config)};
    ork_config_default(&full);
    int after = threads_of_this_process();
    CHECK(before > 0 && after == before, "ork_config_default: %d threads, then %d", before, after);
    CHECK(full.struct_size == sizeof(ork_config), "struct_size %u", full.struct_size);

    long page = sysconf(_SC_PAGESIZE);
    unsigned char *map = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED || mprotect(map + page, (size_t)page, PROT_NONE) != 0) {
        perror("guard page");
        return 2;
    }
    unsigned char *end = map + page; /* the first byte that faults */
    const size_t smallest = offsetof(ork_config, mt_mode);
    const size_t sizes[] = {8, 16, offsetof(ork_config, min_rows_mode), smallest, 48, 96, sizeof(ork_config) - 8, sizeof(ork_config)};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        memset(map, 0xa5, (size_t)page);
        ork_config *short_config = (ork_config *)(end - n);
        short_config->struct_size = (uint32_t)n;
        ork_config_default(short_config);
        same_prefix(short_config, &full, n);
        CHECK(end[-(long)n - 1] == 0xa5, "struct_size %zu: a byte before the struct written", n);
    }
    {
        /* A zeroed struct: ABI 1's smallest, 40 bytes on 64-bit targets. */
        memset(map, 0, (size_t)page);
        ork_config *zeroed = (ork_config *)(end - smallest);
        ork_config_default(zeroed);
        same_prefix(zeroed, &full, smallest);
        printf("config: a zeroed struct_size gets %u bytes (through cache_verify)\n", zeroed->struct_size);
        /* ork_ctx_new reads the 40 bytes, the rest from the defaults. */
        zeroed->backend = ORK_BACKEND_CPU;
        ork_ctx *ctx = ork_ctx_new(zeroed);
        CHECK(ctx != NULL, "ork_ctx_new of the smallest struct: %s", ork_last_error());
        ork_stats st;
        CHECK(ctx && ork_ctx_stats(ctx, &st) == ORK_OK && st.backend == ORK_BACKEND_CPU, "backend of the smallest struct");
        ork_ctx_free(ctx);
    }
    for (uint32_t n = 1; n < 8; n++) {
        memset(map, 0xa5, (size_t)page);
        ork_config *tiny = (ork_config *)(end - 8);
        tiny->struct_size = n;
        ork_config_default(tiny);
        CHECK(tiny->struct_size == n && memcmp(end - 4, "\xa5\xa5\xa5\xa5", 4) == 0, "struct_size %u: written", n);
        CHECK(strstr(ork_last_error(), "struct_size") != NULL, "struct_size %u: %s", n, ork_last_error());
    }
    munmap(map, 2 * (size_t)page);
    printf("config: ork_config_default wrote struct_size bytes (a guard page behind each), started no thread\n");
    if (failures) {
        printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    printf("config: all checks passed\n");
    return 0;
}
