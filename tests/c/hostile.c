/* The C ABI under callers that misuse it or reconfigure it while it runs (uses only
 * include/ork_moe.h and libork_moe.so):
 * 1. Logging: the log callback set, unset and replaced from inside itself and from several threads
 *    while calls run; ORK_LOG=debug writes a line for every call, declined and refused ones included.
 * 2. Cooperative calls (ork_mul_mat_id_mt, ork_mul_mat_mt, ork_mul_mat_id_pair_mt) whose threads
 *    disagree: another nth on one thread, one ith on two, a thread that never comes and a barrier
 *    that gives up. Every thread returns ORK_INVALID_ARGUMENT naming the disagreement, dst stays
 *    untouched, nothing is printed about a panic, and the context's next call is exact.
 * 3. ork_prefetch answers as the call's check for the same descriptors (small batches, NULL data).
 * 4. Injected device faults while the prefetch threads work, and during dense calls whose threads
 *    help them: the exact result or the documented error, and (under LeakSanitizer) nothing leaks.
 * A watchdog ends the program if any case hangs. Exit status 0 only if every check passed.
 * Arguments name the sections to run (reentrant, debug, threads, prefetch, faults); none runs them all. */
#define _POSIX_C_SOURCE 200809L
#include "ork_moe.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { T_F32 = 0, T_Q8_0 = 8, T_I32 = 26 };
enum { K = 64, N = 32, N_EXPERT = 4, N_USED = 2, N_TOKENS = 16, Q8_BYTES = 34 };
static const uint8_t SENTINEL = 0xA5;
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

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "hostile: a case hung (watchdog)\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(3);
}

/* The watchdog: a section that takes longer than `seconds` hangs. */
static void watchdog(unsigned seconds) { alarm(seconds); }

static uint64_t rng_state = 0x243f6a8885a308d3ULL;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ---- one small MUL_MAT_ID (Q8_0 weights), its pair and its dense form ---- */
typedef struct {
    uint8_t *w0, *w1;
    float *b;
    int32_t *ids;
    ork_tensor as0, as1, tb, tids;
} call_data;

static const size_t ROW_BYTES = K / 32 * Q8_BYTES;
static const size_t DST_BYTES = (size_t)N * N_USED * N_TOKENS * 4;

static uint8_t *random_weights(size_t experts) {
    uint8_t *w = malloc(experts * N * ROW_BYTES);
    for (size_t blk = 0; blk < experts * N * (K / 32); blk++) {
        uint8_t *p = w + blk * Q8_BYTES;
        uint16_t scale = (uint16_t)(0x2000 | (rnd() & 0x3ff)); /* about 2^-7 */
        p[0] = (uint8_t)scale;
        p[1] = (uint8_t)(scale >> 8);
        for (int i = 2; i < Q8_BYTES; i++) p[i] = (uint8_t)rnd();
    }
    return w;
}

static ork_tensor weights_desc(uint8_t *w, const char *name) {
    return (ork_tensor){T_Q8_0, {K, N, N_EXPERT, 1}, {Q8_BYTES, ROW_BYTES, ROW_BYTES * N, ROW_BYTES * N * N_EXPERT}, w, name};
}

static void make_call(call_data *c) {
    c->w0 = random_weights(N_EXPERT);
    c->w1 = random_weights(N_EXPERT);
    c->b = malloc((size_t)K * N_TOKENS * sizeof(float));
    c->ids = malloc((size_t)N_USED * N_TOKENS * sizeof(int32_t));
    for (int i = 0; i < K * N_TOKENS; i++) c->b[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    for (int t = 0; t < N_TOKENS; t++) {
        c->ids[t * N_USED] = (int32_t)(rnd() % N_EXPERT);
        c->ids[t * N_USED + 1] = (c->ids[t * N_USED] + 1 + (int32_t)(rnd() % (N_EXPERT - 1))) % N_EXPERT;
    }
    c->as0 = weights_desc(c->w0, "blk.0.ffn_gate_exps.weight");
    c->as1 = weights_desc(c->w1, "blk.0.ffn_up_exps.weight");
    c->tb = (ork_tensor){T_F32, {K, 1, N_TOKENS, 1}, {4, K * 4, K * 4, (size_t)K * 4 * N_TOKENS}, c->b, NULL};
    c->tids = (ork_tensor){T_I32, {N_USED, N_TOKENS, 1, 1}, {4, N_USED * 4, N_USED * 4 * N_TOKENS, N_USED * 4 * N_TOKENS}, c->ids, NULL};
}

static void free_call(call_data *c) {
    free(c->w0);
    free(c->w1);
    free(c->b);
    free(c->ids);
}

static ork_tensor dst_desc(void *dst) {
    return (ork_tensor){T_F32, {N, N_USED, N_TOKENS, 1}, {4, N * 4, N * 4 * N_USED, DST_BYTES}, dst, NULL};
}

/* The dense matmul of weight matrix 0 (expert 0) and the activations: [K, N] x [K, T] -> [N, T]. */
static void dense_descs(const call_data *c, void *dst, ork_tensor *a, ork_tensor *b, ork_tensor *d) {
    *a = c->as0;
    a->ne[2] = 1;
    a->nb[3] = a->nb[2];
    *b = (ork_tensor){T_F32, {K, N_TOKENS, 1, 1}, {4, K * 4, (size_t)K * 4 * N_TOKENS, (size_t)K * 4 * N_TOKENS}, c->b, NULL};
    *d = (ork_tensor){T_F32, {N, N_TOKENS, 1, 1}, {4, N * 4, (size_t)N * 4 * N_TOKENS, (size_t)N * 4 * N_TOKENS}, dst, NULL};
}

static uint8_t *sentinel_buffer(void) {
    uint8_t *d = malloc(DST_BYTES);
    memset(d, SENTINEL, DST_BYTES);
    return d;
}

static int untouched(const uint8_t *d) {
    for (size_t i = 0; i < DST_BYTES; i++)
        if (d[i] != SENTINEL) return 0;
    return 1;
}

/* Each 4-byte element either still the sentinel or equal to `want`'s. */
static int old_or_final(const uint8_t *d, const uint8_t *want) {
    for (size_t i = 0; i < DST_BYTES; i += 4) {
        static const uint8_t old[4] = {0xA5, 0xA5, 0xA5, 0xA5};
        if (memcmp(d + i, old, 4) != 0 && memcmp(d + i, want + i, 4) != 0) return 0;
    }
    return 1;
}

static ork_ctx *new_ctx(uint32_t mt_mode, uint32_t prefetch, const char *faults, uint32_t log_level) {
    ork_config cfg = {.struct_size = sizeof(ork_config)};
    ork_config_default(&cfg);
    cfg.backend = ORK_BACKEND_EMU;
    cfg.dispatch = ORK_DISPATCH_ALWAYS; /* every call taken: nothing left to time ggml */
    cfg.min_rows = 0;
    cfg.mt_mode = mt_mode;
    cfg.prefetch_threads = prefetch;
    cfg.emu_faults = faults;
    cfg.log_level = log_level;
    ork_ctx *ctx = ork_ctx_new(&cfg);
    if (!ctx) {
        fprintf(stderr, "ork_ctx_new: %s\n", ork_last_error());
        exit(2);
    }
    return ctx;
}

/* ---- 1. logging ---- */
static pthread_mutex_t lines_lock = PTHREAD_MUTEX_INITIALIZER;
static char lines[1 << 16];
static size_t lines_len = 0;
static atomic_int delivered = 0;

static void keep_line(const char *message) {
    pthread_mutex_lock(&lines_lock);
    size_t len = strlen(message);
    if (lines_len + len + 2 < sizeof lines) {
        memcpy(lines + lines_len, message, len);
        lines_len += len;
        lines[lines_len++] = '\n';
        lines[lines_len] = '\0';
    }
    pthread_mutex_unlock(&lines_lock);
}

static void clear_lines(void) {
    pthread_mutex_lock(&lines_lock);
    lines_len = 0;
    lines[0] = '\0';
    pthread_mutex_unlock(&lines_lock);
}

static int has_line(const char *a, const char *b) {
    pthread_mutex_lock(&lines_lock);
    int found = 0;
    for (char *line = lines; *line && !found;) {
        char *end = strchr(line, '\n');
        *end = '\0';
        found = strstr(line, a) && strstr(line, b);
        *end = '\n';
        line = end + 1;
    }
    pthread_mutex_unlock(&lines_lock);
    return found;
}

static void collecting(void *user, uint32_t level, const char *message) {
    (void)user;
    (void)level;
    atomic_fetch_add(&delivered, 1);
    keep_line(message);
}

static void replacing(void *user, uint32_t level, const char *message);

/* Every third line it hands logging to `replacing`, the others it unsets and sets itself again. */
static void unsetting(void *user, uint32_t level, const char *message) {
    (void)level;
    (void)message;
    int n = atomic_fetch_add(&delivered, 1);
    if (n % 3 == 0) {
        ork_set_log_callback(replacing, user);
    } else {
        ork_set_log_callback(NULL, NULL);
        ork_set_log_callback(unsetting, user);
    }
}

static void replacing(void *user, uint32_t level, const char *message) {
    (void)level;
    (void)message;
    atomic_fetch_add(&delivered, 1);
    ork_set_log_callback(unsetting, user);
}

typedef struct {
    ork_ctx *ctx;
    call_data *c;
    int rounds;
    atomic_int *stop;
} caller_arg;

/* Calls in a loop: handled routed and dense calls, a declined dense call, an invalid one. */
static void *calling(void *v) {
    caller_arg *a = v;
    uint8_t *dst = sentinel_buffer();
    ork_tensor d = dst_desc(dst), da, db, dd;
    dense_descs(a->c, dst, &da, &db, &dd);
    ork_tensor batched = db;
    batched.ne[1] = N_TOKENS / 2;
    batched.ne[2] = 2;
    for (int r = 0; r < a->rounds; r++) {
        CHECK(ork_mul_mat_id(a->ctx, &a->c->as0, &a->c->tb, &a->c->tids, &d) == ORK_OK, "logging: call: %s", ork_last_error());
        CHECK(ork_mul_mat(a->ctx, &da, &db, &dd) == ORK_OK, "logging: dense: %s", ork_last_error());
        CHECK(ork_mul_mat(a->ctx, &da, &batched, &dd) == ORK_NOT_HANDLED, "logging: batched dense");
        CHECK(ork_mul_mat(a->ctx, &da, &db, NULL) == ORK_INVALID_ARGUMENT, "logging: dense without dst");
    }
    free(dst);
    return NULL;
}

/* Sets, unsets and replaces the callback as fast as it can until told to stop. */
static void *switching(void *v) {
    caller_arg *a = v;
    for (unsigned i = 0; !atomic_load(a->stop); i++) {
        switch (i % 4) {
        case 0: ork_set_log_callback(collecting, NULL); break;
        case 1: ork_set_log_callback(NULL, NULL); break;
        case 2: ork_set_log_callback(unsetting, NULL); break;
        default: ork_set_log_callback(replacing, NULL); break;
        }
    }
    return NULL;
}

/* ORK_LOG=debug: a line for every call, with its outcome. */
static void debug_lines(void) {
    watchdog(120);
    ork_ctx *ctx = new_ctx(ORK_MT_COOP, 0, NULL, ORK_LOG_DEBUG);
    call_data c;
    make_call(&c);
    uint8_t *dst = sentinel_buffer();
    ork_tensor d = dst_desc(dst), da, db, dd;
    dense_descs(&c, dst, &da, &db, &dd);
    ork_set_log_callback(collecting, NULL);
    clear_lines();
    ork_tensor batched = db, narrow = dd, no_data = c.tb;
    batched.ne[1] = N_TOKENS / 2;
    batched.ne[2] = 2;
    narrow.ne[0] = N / 2;
    no_data.data = NULL;
    CHECK(ork_mul_mat(ctx, &da, &db, &dd) == ORK_OK, "dense: %s", ork_last_error());
    CHECK(ork_mul_mat(ctx, &da, &batched, &dd) == ORK_NOT_HANDLED, "batched dense");
    CHECK(ork_mul_mat(ctx, &da, &db, &narrow) == ORK_INVALID_ARGUMENT, "narrow dense");
    CHECK(ork_mul_mat_id(ctx, &c.as0, &no_data, &c.tids, &d) == ORK_INVALID_ARGUMENT, "NULL b");
    CHECK(ork_mul_mat_id(NULL, &c.as0, &c.tb, &c.tids, &d) == ORK_INVALID_ARGUMENT, "NULL ctx");
    ork_threads bad = {3, 2, NULL, NULL, NULL, 0};
    CHECK(ork_mul_mat_mt(ctx, &da, &db, &dd, &bad) == ORK_INVALID_ARGUMENT, "ith 3 of 2");
    ork_set_log_callback(NULL, NULL);
    CHECK(has_line("handled", "K=64 N=32"), "no line for a handled call:\n%s", lines);
    CHECK(has_line("ork_mul_mat: declined", "batched"), "no line for a declined dense call:\n%s", lines);
    CHECK(has_line("ork_mul_mat: invalid argument", "dst: ne"), "no line for an invalid dense call:\n%s", lines);
    CHECK(has_line("ork_mul_mat_id: invalid argument", "b: data is NULL"), "no line for NULL data:\n%s", lines);
    CHECK(has_line("ork_mul_mat_id: invalid argument", "ctx is NULL"), "no line for a NULL ctx:\n%s", lines);
    CHECK(has_line("ork_mul_mat_mt: invalid argument", "ith 3 / nth 2"), "no line for bad threads:\n%s", lines);
    printf("logging: a line for every call, declined and refused ones included\n");
    ork_ctx_free(ctx);
    free(dst);
    free_call(&c);
    watchdog(0);
}

/* The callback set, unset and replaced from inside itself, then from two threads while four call. */
static void reentrant_logging(void) {
    watchdog(120);
    ork_ctx *ctx = new_ctx(ORK_MT_COOP, 0, NULL, ORK_LOG_DEBUG);
    call_data c;
    make_call(&c);
    uint8_t *dst = sentinel_buffer();
    ork_tensor d = dst_desc(dst);
    atomic_store(&delivered, 0);
    ork_set_log_callback(unsetting, NULL);
    for (int i = 0; i < 6; i++) CHECK(ork_mul_mat_id(ctx, &c.as0, &c.tb, &c.tids, &d) == ORK_OK, "re-entrant: %s", ork_last_error());
    CHECK(atomic_load(&delivered) >= 6, "re-entrant: %d lines delivered", atomic_load(&delivered));
    atomic_int stop = 0;
    pthread_t callers[4], switchers[2];
    caller_arg arg = {ctx, &c, 25, &stop};
    for (int i = 0; i < 4; i++) pthread_create(&callers[i], NULL, calling, &arg);
    for (int i = 0; i < 2; i++) pthread_create(&switchers[i], NULL, switching, &arg);
    for (int i = 0; i < 4; i++) pthread_join(callers[i], NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(switchers[i], NULL);
    ork_set_log_callback(NULL, NULL);
    printf("logging: callback set, unset and replaced from inside itself and from other threads, no hang\n");
    ork_ctx_free(ctx);
    free(dst);
    free_call(&c);
    watchdog(0);
}

/* ---- 2. cooperative calls whose threads disagree ---- */
/* A barrier of `target` threads that gives up after `timeout_ms` (a caller's bug). */
typedef struct {
    pthread_mutex_t m;
    pthread_cond_t cv;
    int count, target, timeout_ms;
    unsigned gen;
} giving_up_barrier;

static void giving_up_wait(void *arg) {
    giving_up_barrier *b = arg;
    pthread_mutex_lock(&b->m);
    unsigned gen = b->gen;
    if (++b->count == b->target) {
        b->count = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->m);
        return;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)b->timeout_ms * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (b->gen == gen) {
        if (pthread_cond_timedwait(&b->cv, &b->m, &until) == ETIMEDOUT) {
            if (b->gen == gen) b->count--;
            break;
        }
    }
    pthread_mutex_unlock(&b->m);
}

static void pthread_barrier_cb(void *arg) { pthread_barrier_wait(arg); }

enum entry { MMID, DENSE, PAIR };
static const char *ENTRY_NAMES[] = {"ork_mul_mat_id_mt", "ork_mul_mat_mt", "ork_mul_mat_id_pair_mt"};

typedef struct {
    ork_ctx *ctx;
    const call_data *c;
    enum entry entry;
    uint8_t *dst0, *dst1;
    ork_threads th;
    ork_result rc;
    char msg[512];
} mt_arg;

static void *mt_thread(void *v) {
    mt_arg *a = v;
    ork_tensor d0 = dst_desc(a->dst0), d1 = dst_desc(a->dst1), da, db, dd;
    switch (a->entry) {
    case MMID: a->rc = ork_mul_mat_id_mt(a->ctx, &a->c->as0, &a->c->tb, &a->c->tids, &d0, &a->th); break;
    case DENSE:
        dense_descs(a->c, a->dst0, &da, &db, &dd);
        a->rc = ork_mul_mat_mt(a->ctx, &da, &db, &dd, &a->th);
        break;
    case PAIR: a->rc = ork_mul_mat_id_pair_mt(a->ctx, &a->c->as0, &a->c->as1, &a->c->tb, &a->c->tids, &d0, &d1, &a->th); break;
    }
    snprintf(a->msg, sizeof a->msg, "%s", ork_last_error());
    return NULL;
}

/* Runs `entry` on threads with the descriptors (ith[i], nth[i]) and the given barrier; each
 * thread's code and message land in `args`. */
static void run_threads(mt_arg *args, int n, ork_ctx *ctx, const call_data *c, enum entry entry, uint8_t *d0, uint8_t *d1,
                        const int *ith, const int *nth, void (*barrier)(void *), void *barrier_arg) {
    pthread_t tid[8];
    for (int i = 0; i < n; i++) {
        args[i] = (mt_arg){ctx, c, entry, d0, d1, {ith[i], nth[i], barrier, barrier_arg, NULL, 0}, 99, ""};
        pthread_create(&tid[i], NULL, mt_thread, &args[i]);
    }
    for (int i = 0; i < n; i++) pthread_join(tid[i], NULL);
}

/* The library's stderr, captured into a file while `f` runs: nothing may mention a panic. */
static int stderr_fd = -1;
static FILE *captured = NULL;

static void capture_stderr(void) {
    fflush(stderr);
    captured = tmpfile();
    stderr_fd = dup(2);
    dup2(fileno(captured), 2);
}

static void release_stderr(const char *what) {
    fflush(stderr);
    dup2(stderr_fd, 2);
    close(stderr_fd);
    char text[4096] = "";
    rewind(captured);
    size_t len = fread(text, 1, sizeof text - 1, captured);
    text[len] = '\0';
    fclose(captured);
    CHECK(strstr(text, "panic") == NULL, "%s: stderr mentions a panic:\n%s", what, text);
}

typedef struct {
    const char *what;
    int threads;
    int ith[4], nth[4];
    int barrier_of; /* threads the barrier waits for */
    int gives_up;
    const char *says;
} disagreement;

static const disagreement CASES[] = {
    {"nth differs", 3, {0, 1, 2}, {3, 2, 3}, 3, 0, "nth"},
    {"two threads with ith 1", 3, {0, 1, 1}, {3, 3, 3}, 3, 0, "two threads passed ith = 1"},
    {"a thread too many", 4, {0, 1, 2, 0}, {3, 3, 3, 3}, 4, 0, "two threads passed ith = 0"},
    {"a thread never comes, the barrier gives up", 2, {0, 2}, {3, 3}, 3, 1, "never came"},
};

static void disagreeing_threads(void) {
    watchdog(300);
    call_data c;
    make_call(&c);
    ork_ctx *single = new_ctx(ORK_MT_COOP, 0, NULL, ORK_LOG_WARN);
    uint8_t *want[3][2];
    for (int e = 0; e < 3; e++) {
        for (int j = 0; j < 2; j++) want[e][j] = sentinel_buffer();
        ork_tensor d0 = dst_desc(want[e][0]), d1 = dst_desc(want[e][1]), da, db, dd;
        dense_descs(&c, want[e][0], &da, &db, &dd);
        ork_result rc = e == MMID    ? ork_mul_mat_id(single, &c.as0, &c.tb, &c.tids, &d0)
                        : e == DENSE ? ork_mul_mat(single, &da, &db, &dd)
                                     : ork_mul_mat_id_pair(single, &c.as0, &c.as1, &c.tb, &c.tids, &d0, &d1);
        CHECK(rc == ORK_OK, "%s single: %s", ENTRY_NAMES[e], ork_last_error());
    }
    for (uint32_t mode = ORK_MT_COOP; mode <= ORK_MT_LEADER; mode++) {
        ork_ctx *ctx = new_ctx(mode, 0, NULL, ORK_LOG_WARN);
        for (int e = 0; e < 3; e++) {
            for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
                const disagreement *x = &CASES[k];
                uint8_t *d0 = sentinel_buffer(), *d1 = sentinel_buffer();
                mt_arg args[4];
                capture_stderr();
                if (x->gives_up) {
                    giving_up_barrier b = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, x->barrier_of, 200, 0};
                    run_threads(args, x->threads, ctx, &c, e, d0, d1, x->ith, x->nth, giving_up_wait, &b);
                } else {
                    pthread_barrier_t b;
                    pthread_barrier_init(&b, NULL, (unsigned)x->barrier_of);
                    run_threads(args, x->threads, ctx, &c, e, d0, d1, x->ith, x->nth, pthread_barrier_cb, &b);
                    pthread_barrier_destroy(&b);
                }
                char what[160];
                snprintf(what, sizeof what, "%s, %s, %s", ENTRY_NAMES[e], mode == ORK_MT_COOP ? "coop" : "leader", x->what);
                release_stderr(what);
                for (int i = 0; i < x->threads; i++) {
                    CHECK(args[i].rc == ORK_INVALID_ARGUMENT, "%s: thread %d returned %u (%s)", what, i, args[i].rc, args[i].msg);
                    CHECK(strstr(args[i].msg, "threads: ") != NULL && strstr(args[i].msg, x->says) != NULL,
                          "%s: thread %d says \"%s\"", what, i, args[i].msg);
                }
                CHECK(untouched(d0) && untouched(d1), "%s: dst was written", what);
                printf("  %-64s -> %u  \"%s\"\n", what, args[0].rc, args[0].msg);
                /* The context is not left waiting for the missing threads: the same call is exact. */
                memset(d0, SENTINEL, DST_BYTES);
                pthread_barrier_t b;
                pthread_barrier_init(&b, NULL, 3);
                int ith[3] = {0, 1, 2}, nth[3] = {3, 3, 3};
                run_threads(args, 3, ctx, &c, e, d0, d1, ith, nth, pthread_barrier_cb, &b);
                pthread_barrier_destroy(&b);
                for (int i = 0; i < 3; i++) CHECK(args[i].rc == ORK_OK, "%s, then agreeing: %u %s", what, args[i].rc, args[i].msg);
                CHECK(memcmp(d0, want[e][0], DST_BYTES) == 0 && (e != PAIR || memcmp(d1, want[e][1], DST_BYTES) == 0),
                      "%s, then agreeing: not the single caller's bits", what);
                free(d0);
                free(d1);
            }
        }
        ork_ctx_free(ctx);
    }
    ork_ctx_free(single);
    for (int e = 0; e < 3; e++)
        for (int j = 0; j < 2; j++) free(want[e][j]);
    free_call(&c);
    printf("disagreeing threads: INVALID_ARGUMENT on every thread, dst untouched, no panic\n");
    watchdog(0);
}

/* ---- 3. ork_prefetch answers as the check ---- */
static void prefetch_answers(void) {
    watchdog(120);
    call_data c;
    make_call(&c);
    uint8_t *dst0 = sentinel_buffer(), *dst1 = sentinel_buffer();
    ork_tensor d0 = dst_desc(dst0), d1 = dst_desc(dst1);
    ork_config cfg = {.struct_size = sizeof(ork_config)};
    ork_config_default(&cfg);
    cfg.backend = ORK_BACKEND_EMU;
    cfg.dispatch = ORK_DISPATCH_ALWAYS; /* every call taken: nothing left to time ggml */
    cfg.prefetch_threads = 1;
    cfg.min_rows = 64; /* N_TOKENS * N_USED / N_EXPERT = 8 rows per expert: a small batch */
    ork_ctx *decline = ork_ctx_new(&cfg);
    cfg.min_rows_mode = ORK_MIN_ROWS_CPU;
    ork_ctx *cpu = ork_ctx_new(&cfg);
    cfg.min_rows = 0;
    ork_ctx *take = ork_ctx_new(&cfg);
    CHECK(decline && cpu && take, "prefetch contexts: %s", ork_last_error());
    if (!decline || !cpu || !take) return;
    ork_tensor no_b = c.tb, no_ids = c.tids, no_dst = d0, narrow = d0;
    no_b.data = NULL;
    no_ids.data = NULL;
    no_dst.data = NULL;
    narrow.ne[0] = N / 2;
    struct {
        const char *what;
        ork_ctx *ctx;
        const ork_tensor *b, *ids, *dst;
        ork_result want;
    } cases[] = {
        {"taken", take, &c.tb, &c.tids, &d0, ORK_OK},
        {"small batch, declined", decline, &c.tb, &c.tids, &d0, ORK_NOT_HANDLED},
        {"small batch on the CPU", cpu, &c.tb, &c.tids, &d0, ORK_OK},
        {"NULL b data", take, &no_b, &c.tids, &d0, ORK_INVALID_ARGUMENT},
        {"NULL ids data", take, &c.tb, &no_ids, &d0, ORK_INVALID_ARGUMENT},
        {"NULL dst data", take, &c.tb, &c.tids, &no_dst, ORK_INVALID_ARGUMENT},
        {"dst of another shape", take, &c.tb, &c.tids, &narrow, ORK_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ork_result check = ork_mul_mat_id_check(cases[i].ctx, &c.as0, cases[i].b, cases[i].ids, cases[i].dst);
        ork_result announced = ork_prefetch(cases[i].ctx, &c.as0, NULL, cases[i].b, cases[i].ids, cases[i].dst, NULL);
        CHECK(check == cases[i].want && announced == check, "prefetch, %s: check %u, prefetch %u, want %u (%s)", cases[i].what, check,
              announced, cases[i].want, ork_last_error());
        ork_result pair_check = ork_mul_mat_id_pair_check(cases[i].ctx, &c.as0, &c.as1, cases[i].b, cases[i].ids, cases[i].dst, &d1);
        ork_result pair = ork_prefetch(cases[i].ctx, &c.as0, &c.as1, cases[i].b, cases[i].ids, cases[i].dst, &d1);
        CHECK(pair_check == cases[i].want && pair == pair_check, "prefetch of a pair, %s: check %u, prefetch %u", cases[i].what,
              pair_check, pair);
    }
    for (ork_ctx **x = (ork_ctx *[]){decline, cpu, take}, **end = x + 3; x < end; x++) {
        CHECK(ork_prefetch_fence(*x) == ORK_OK, "fence");
        ork_ctx_free(*x);
    }
    CHECK(untouched(dst0) && untouched(dst1), "an announcement wrote dst");
    printf("prefetch: the check's answer for the same descriptors\n");
    free(dst0);
    free(dst1);
    free_call(&c);
    watchdog(0);
}

/* ---- 4. device faults while the prefetch threads work ---- */
static void faults_during_prefetch(void) {
    watchdog(300);
    call_data c;
    make_call(&c);
    ork_ctx *clean = new_ctx(ORK_MT_COOP, 0, NULL, ORK_LOG_WARN);
    uint8_t *want[3];
    for (int i = 0; i < 3; i++) want[i] = sentinel_buffer();
    ork_tensor w0 = dst_desc(want[0]), w1 = dst_desc(want[1]), wa, wb, wd;
    dense_descs(&c, want[2], &wa, &wb, &wd);
    CHECK(ork_mul_mat_id_pair(clean, &c.as0, &c.as1, &c.tb, &c.tids, &w0, &w1) == ORK_OK, "clean pair: %s", ork_last_error());
    CHECK(ork_mul_mat(clean, &wa, &wb, &wd) == ORK_OK, "clean dense: %s", ork_last_error());
    ork_ctx_free(clean);
    static const char *FAULTS[] = {"alloc:1", "alloc:3", "alloc:2+", "domain_full:2", "sync_to_device:1", "sync_to_device:3",
                                   "sync_to_device:1+", "run:2", "sync_from_device:1"};
    for (size_t f = 0; f < sizeof FAULTS / sizeof FAULTS[0]; f++) {
        ork_config cfg = {.struct_size = sizeof(ork_config)};
        ork_config_default(&cfg);
        cfg.backend = ORK_BACKEND_EMU;
        cfg.dispatch = ORK_DISPATCH_ALWAYS; /* every call taken: nothing left to time ggml */
        cfg.min_rows = 0;
        cfg.cache_bytes = 0;
        cfg.prefetch_threads = 2;
        cfg.submitters = 3; /* a dense call's threads wait for runs, and help the prefetch meanwhile */
        cfg.emu_faults = FAULTS[f];
        ork_ctx *ctx = ork_ctx_new(&cfg);
        CHECK(ctx != NULL, "%s: %s", FAULTS[f], ork_last_error());
        if (!ctx) continue;
        uint8_t *d[3];
        for (int i = 0; i < 3; i++) d[i] = sentinel_buffer();
        ork_tensor d0 = dst_desc(d[0]), d1 = dst_desc(d[1]), da, db, dd;
        dense_descs(&c, d[2], &da, &db, &dd);
        ork_result announced = ork_prefetch(ctx, &c.as0, &c.as1, &c.tb, &c.tids, &d0, &d1);
        CHECK(announced == ORK_OK, "%s: announce: %s", FAULTS[f], ork_last_error());
        ork_result dense = ork_mul_mat(ctx, &da, &db, &dd);
        ork_result pair = ork_mul_mat_id_pair(ctx, &c.as0, &c.as1, &c.tb, &c.tids, &d0, &d1);
        CHECK(ork_prefetch_fence(ctx) == ORK_OK, "%s: fence", FAULTS[f]);
        ork_result rcs[2] = {dense, pair};
        for (int i = 0; i < 2; i++)
            CHECK(rcs[i] == ORK_OK || rcs[i] == ORK_DEVICE_ERROR || rcs[i] == ORK_OUT_OF_MEMORY, "%s: %s returned %u", FAULTS[f],
                  i ? "pair" : "dense", rcs[i]);
        if (dense == ORK_OK) CHECK(memcmp(d[2], want[2], DST_BYTES) == 0, "%s: dense not exact", FAULTS[f]);
        if (pair == ORK_OK) CHECK(memcmp(d[0], want[0], DST_BYTES) == 0 && memcmp(d[1], want[1], DST_BYTES) == 0, "%s: pair not exact", FAULTS[f]);
        for (int i = 0; i < 3; i++) CHECK(old_or_final(d[i], want[i]), "%s: dst %d neither old nor final", FAULTS[f], i);
        printf("  %-20s dense -> %u, pair -> %u\n", FAULTS[f], dense, pair);
        ork_ctx_free(ctx);
        for (int i = 0; i < 3; i++) free(d[i]);
    }
    for (int i = 0; i < 3; i++) free(want[i]);
    free_call(&c);
    printf("faults during prefetch: exact results or the device's error, no hang\n");
    watchdog(0);
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*run)(void);
    } SECTIONS[] = {{"reentrant", reentrant_logging}, {"debug", debug_lines}, {"threads", disagreeing_threads}, {"prefetch", prefetch_answers}, {"faults", faults_during_prefetch}};
    signal(SIGALRM, on_alarm);
    for (size_t i = 0; i < sizeof SECTIONS / sizeof SECTIONS[0]; i++) {
        int chosen = argc == 1;
        for (int a = 1; a < argc; a++) chosen |= strcmp(argv[a], SECTIONS[i].name) == 0;
        if (chosen) SECTIONS[i].run();
    }
    if (failures) {
        printf("hostile: %d check(s) FAILED\n", failures);
        return 1;
    }
    printf("hostile: all checks passed\n");
    return 0;
}
