/* C harness for libork_moe: uses only include/ork_moe.h and libork_moe.so.
 *
 * 1. Matrix: for every A3B expert shape, weight type whose block divides K, and n_tokens, one
 *    MUL_MAT_ID call on the emulated NPU and one on the CPU int8 backend: dst must be equal byte for
 *    byte, both within ggml's NMSE bound (5e-4) of an f64 reference from the weights dequantized by
 *    dequant.c (not by the library), and the padding between dst rows untouched. The cooperative
 *    entry point (pthreads + barrier) must give the same bytes as the single-caller one.
 * 2. Bad input: every rejected call returns its code and a message, and leaves dst untouched.
 * 3. A pair call (gate and up of one input) gives the bytes of its two single calls.
 * 4. Layout codes in ork_tensor.type (ORK_TYPE_*): decoded by ork_supports_type and the checks; whole
 *    groups of packed rows or INVALID_ARGUMENT, unknown layouts NOT_HANDLED (the bits of repacked
 *    experts are checked in tests/engine.rs).
 *
 * Environment: QUICK=1 runs a reduced matrix (for sanitizers and qemu).
 * Exit status 0 only if every check passed. */
#define _POSIX_C_SOURCE 200809L
#include "ork_moe.h"
#include "dequant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14, T_I32 = 26 };

static const double GGML_NMSE_BOUND = 5e-4; /* test-backend-ops, MUL_MAT_ID */
static const int N_EXPERT = 128, N_USED = 8, HOT = 5;
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

/* ---- deterministic random numbers (splitmix64) ---- */
static uint64_t rng_state = 0x0123456789abcdefULL;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

/* A finite fp16 with biased exponent in [e_lo, e_hi], random mantissa, optional random sign. */
static uint16_t rand_half(int e_lo, int e_hi, int signed_) {
    uint16_t e = (uint16_t)(e_lo + (int)(rnd() % (uint64_t)(e_hi - e_lo + 1)));
    uint16_t h = (uint16_t)((e << 10) | (rnd() & 0x3ff));
    if (signed_ && (rnd() & 1)) h |= 0x8000;
    return h;
}
static void put_half(uint8_t *p, uint16_t h) { p[0] = (uint8_t)h; p[1] = (uint8_t)(h >> 8); }

typedef struct { int id; const char *name; int block; int bytes; } wtype;
static const wtype TYPES[] = {
    {T_Q4_0, "q4_0", 32, 18}, {T_Q4_1, "q4_1", 32, 20}, {T_Q5_0, "q5_0", 32, 22},
    {T_Q8_0, "q8_0", 32, 34}, {T_Q4_K, "q4_K", 256, 144}, {T_Q6_K, "q6_K", 256, 210},
};

/* Random bytes are valid blocks except for NaN/Inf fp16 scales: overwrite those with finite,
 * realistically ranged ones (block scales of one row within a factor of about 4). */
static void random_blocks(const wtype *t, uint8_t *p, size_t n_blocks) {
    for (size_t i = 0; i < n_blocks; i++, p += t->bytes) {
        for (int j = 0; j < t->bytes; j++) p[j] = (uint8_t)rnd();
        switch (t->id) {
        case T_Q4_0: case T_Q5_0: case T_Q8_0: put_half(p, rand_half(5, 6, 0)); break;
        case T_Q4_1: put_half(p, rand_half(5, 6, 0)); put_half(p + 2, rand_half(6, 8, 1)); break;
        case T_Q4_K: put_half(p, rand_half(3, 4, 0)); put_half(p + 2, rand_half(3, 4, 0)); break;
        case T_Q6_K: put_half(p + 208, rand_half(2, 3, 0)); break;
        }
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- one problem: tensors with (deliberately non-contiguous) strides ---- */
typedef struct {
    const wtype *t;
    int64_t k, n, n_tokens, b_rows;
    size_t row_bytes;
    uint8_t *w; float *b; int32_t *ids;
    size_t w_bytes, b_bytes, ids_bytes, dst_bytes;
    ork_tensor tw, tb, tids, tdst;
} problem;

static const uint8_t SENTINEL = 0xA5;

static void make_descs(problem *p, void *dst) {
    size_t wnb1 = p->row_bytes, wnb2 = wnb1 * (size_t)p->n + 64; /* experts 64 bytes apart: a view */
    size_t bnb1 = (size_t)p->k * 4 + 32, bnb2 = bnb1 * (size_t)p->b_rows + 16;
    size_t inb1 = (size_t)N_USED * 4 + 8;
    size_t dnb1 = (size_t)p->n * 4 + 16, dnb2 = dnb1 * N_USED + 32;
    p->tw = (ork_tensor){T_Q4_0, {p->k, p->n, N_EXPERT, 1}, {(size_t)p->t->bytes, wnb1, wnb2, wnb2 * N_EXPERT}, p->w, "blk.0.ffn_exps.weight"};
    p->tw.type = p->t->id;
    p->tb = (ork_tensor){T_F32, {p->k, p->b_rows, p->n_tokens, 1}, {4, bnb1, bnb2, bnb2 * (size_t)p->n_tokens}, p->b, NULL};
    p->tids = (ork_tensor){T_I32, {N_USED, p->n_tokens, 1, 1}, {4, inb1, inb1 * (size_t)p->n_tokens, inb1 * (size_t)p->n_tokens}, p->ids, NULL};
    p->tdst = (ork_tensor){T_F32, {p->n, N_USED, p->n_tokens, 1}, {4, dnb1, dnb2, dnb2 * (size_t)p->n_tokens}, dst, NULL};
    p->w_bytes = wnb2 * N_EXPERT;
    p->b_bytes = bnb2 * (size_t)p->n_tokens;
    p->ids_bytes = inb1 * (size_t)p->n_tokens;
    p->dst_bytes = dnb2 * (size_t)p->n_tokens;
}

static float *dst_at(const problem *p, void *dst, int64_t token, int slot) {
    return (float *)((uint8_t *)dst + (size_t)token * p->tdst.nb[2] + (size_t)slot * p->tdst.nb[1]);
}
static const float *b_row(const problem *p, int64_t token, int slot) {
    return (const float *)((const uint8_t *)p->b + (size_t)token * p->tb.nb[2] + (size_t)(slot % p->b_rows) * p->tb.nb[1]);
}
static int32_t *id_at(const problem *p, int64_t token, int slot) {
    return (int32_t *)((uint8_t *)p->ids + (size_t)token * p->tids.nb[1] + (size_t)slot * 4);
}

/* Skewed routing: slot 0 goes to the hot expert for most tokens, the others favour low ids, and
 * experts 96..127 are never used. Ids of one token are distinct (top-k). */
static void route(problem *p) {
    for (int64_t t = 0; t < p->n_tokens; t++) {
        for (int s = 0; s < N_USED; s++) {
            int e, dup;
            do {
                double u = unit();
                e = (s == 0 && unit() < 0.9) ? HOT : (int)(96.0 * u * u);
                dup = 0;
                for (int j = 0; j < s; j++) dup |= *id_at(p, t, j) == e;
            } while (dup);
            *id_at(p, t, s) = e;
        }
    }
}

static void fill_activations(problem *p) {
    memset(p->b, 0, p->b_bytes);
    for (int64_t t = 0; t < p->n_tokens; t++)
        for (int r = 0; r < p->b_rows; r++) {
            float *x = (float *)((uint8_t *)p->b + (size_t)t * p->tb.nb[2] + (size_t)r * p->tb.nb[1]);
            for (int64_t i = 0; i < p->k; i++) x[i] = (float)(2.0 * unit() - 1.0);
        }
}

/* ---- the f64 reference on sampled rows ---- */
typedef struct { int expert; float *w; } dequant_expert;

static void dequant(const problem *p, int e, float *out) {
    for (int64_t r = 0; r < p->n; r++) {
        const uint8_t *src = p->w + (size_t)e * p->tw.nb[2] + (size_t)r * p->tw.nb[1];
        CHECK(ref_dequantize_row(p->t->id, src, out + (size_t)r * p->k, p->k), "no reference dequantization of %s", p->t->name);
    }
}

/* NMSE of dst against the f64 reference over up to max_rows rows routed to the experts of `refs`. */
static double nmse(const problem *p, void *dst, const dequant_expert *refs, int n_refs, int max_rows, int *rows_used) {
    double err = 0, ref2 = 0;
    int64_t total = p->n_tokens * N_USED, step = total / max_rows + 1;
    int used = 0;
    for (int64_t i = 0; i < total; i += step) {
        for (int64_t j = i; j < total && j < i + step; j++) {
            int64_t t = j / N_USED;
            int s = (int)(j % N_USED);
            const dequant_expert *d = NULL;
            for (int q = 0; q < n_refs; q++)
                if (refs[q].expert == *id_at(p, t, s)) d = &refs[q];
            if (!d) continue;
            const float *x = b_row(p, t, s);
            const float *y = dst_at(p, dst, t, s);
            for (int64_t c = 0; c < p->n; c++) {
                const float *w = d->w + (size_t)c * p->k;
                double acc = 0;
                for (int64_t k = 0; k < p->k; k++) acc += (double)w[k] * (double)x[k];
                err += (y[c] - acc) * (y[c] - acc);
                ref2 += acc * acc;
            }
            used++;
            break;
        }
    }
    *rows_used = used;
    return ref2 > 0 ? err / ref2 : err;
}

/* Bytes of dst outside the output rows (stride padding) must keep the sentinel. */
static int padding_intact(const problem *p, const uint8_t *dst) {
    for (int64_t t = 0; t < p->n_tokens; t++)
        for (int s = 0; s < N_USED; s++) {
            const uint8_t *row = (const uint8_t *)dst_at(p, (void *)dst, t, s);
            size_t row_end = (size_t)p->n * 4;
            size_t gap = (s + 1 < N_USED) ? p->tdst.nb[1] - row_end : p->tdst.nb[2] - (size_t)(N_USED - 1) * p->tdst.nb[1] - row_end;
            if (t + 1 == p->n_tokens && s + 1 == N_USED) gap = 0;
            for (size_t i = 0; i < gap; i++)
                if (row[row_end + i] != SENTINEL) return 0;
        }
    return 1;
}

/* ---- cooperative calls from pthreads ---- */
typedef struct {
    ork_ctx *ctx;
    problem *p;
    pthread_barrier_t *barrier;
    int ith, nth;
    ork_result rc;
} mt_arg;

static void barrier_cb(void *arg) { pthread_barrier_wait((pthread_barrier_t *)arg); }

static void *mt_thread(void *v) {
    mt_arg *a = v;
    ork_threads th = {a->ith, a->nth, barrier_cb, a->barrier, NULL, 0};
    a->rc = ork_mul_mat_id_mt(a->ctx, &a->p->tw, &a->p->tb, &a->p->tids, &a->p->tdst, &th);
    return NULL;
}

/* Runs the cooperative entry on nth threads; returns the common code, or 99 if they differ. */
static ork_result run_mt(ork_ctx *ctx, problem *p, int nth) {
    pthread_t tid[8];
    mt_arg args[8];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)nth);
    for (int i = 0; i < nth; i++) {
        args[i] = (mt_arg){ctx, p, &barrier, i, nth, 0};
        pthread_create(&tid[i], NULL, mt_thread, &args[i]);
    }
    for (int i = 0; i < nth; i++) pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&barrier);
    for (int i = 1; i < nth; i++)
        if (args[i].rc != args[0].rc) return 99;
    return args[0].rc;
}

static ork_ctx *new_ctx(int backend, uint32_t min_rows, uint32_t mode, uint32_t mt_mode) {
    ork_config cfg = {.struct_size = sizeof(ork_config)};
    ork_config_default(&cfg);
    cfg.backend = backend;
    cfg.dispatch = ORK_DISPATCH_ALWAYS; /* every call taken: nothing left to time ggml */
    cfg.cache_bytes = (uint64_t)512 << 20; /* below the big shapes' working set: evictions happen */
    cfg.min_rows = min_rows;
    cfg.min_rows_mode = mode;
    cfg.mt_mode = mt_mode;
    ork_ctx *ctx = ork_ctx_new(&cfg);
    if (!ctx) {
        fprintf(stderr, "ork_ctx_new(backend %d): %s\n", backend, ork_last_error());
        exit(2);
    }
    return ctx;
}

static void alloc_problem(problem *p, const wtype *t, int64_t k, int64_t n, int64_t max_tokens) {
    memset(p, 0, sizeof *p);
    p->t = t; p->k = k; p->n = n; p->n_tokens = max_tokens;
    p->b_rows = (k == 2048 || k == 4096) ? 1 : N_USED; /* gate/up: broadcast b; down: one row per slot */
    p->row_bytes = (size_t)(k / t->block) * (size_t)t->bytes;
    make_descs(p, NULL);
    p->w = malloc(p->w_bytes);
    p->b = malloc(p->b_bytes);
    p->ids = malloc(p->ids_bytes);
    if (!p->w || !p->b || !p->ids) { fprintf(stderr, "out of memory\n"); exit(2); }
    memset(p->w, 0, p->w_bytes);
    for (int e = 0; e < N_EXPERT; e++)
        for (int64_t r = 0; r < n; r++)
            random_blocks(t, p->w + (size_t)e * p->tw.nb[2] + (size_t)r * p->tw.nb[1], (size_t)(k / t->block));
}

static void free_problem(problem *p) { free(p->w); free(p->b); free(p->ids); }

static void run_matrix(ork_ctx *emu, ork_ctx *cpu, ork_ctx *lead, int quick) {
    static const int64_t SHAPES[][2] = {{2048, 768}, {768, 2048}, {4096, 1408}, {1408, 4096}};
    static const int64_t TOKENS_FULL[] = {1, 8, 16, 32, 64, 128, 512};
    static const int64_t TOKENS_QUICK[] = {1, 16, 64};
    const int64_t *tokens = quick ? TOKENS_QUICK : TOKENS_FULL;
    int n_tok = quick ? 3 : 7;
    printf("%-5s %5s %5s %8s  %-9s %-4s %-11s %-11s %-9s %6s %6s\n", "type", "K", "N", "n_tokens", "emu==cpu", "mt", "nmse_emu", "nmse_cpu",
           "ggml_max", "rows", "sec");
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++) {
            const wtype *t = &TYPES[ti];
            int64_t k = SHAPES[si][0], n = SHAPES[si][1];
            if (k % t->block) continue;
            if (quick && t->id != T_Q4_0 && t->id != T_Q4_K && t->id != T_Q6_K) continue;
            problem p;
            alloc_problem(&p, t, k, n, tokens[n_tok - 1]);
            for (int ni = 0; ni < n_tok; ni++) {
                double t0 = now_s();
                p.n_tokens = tokens[ni];
                make_descs(&p, NULL);
                route(&p);
                fill_activations(&p);
                uint8_t *d_emu = malloc(p.dst_bytes), *d_cpu = malloc(p.dst_bytes), *d_mt = malloc(p.dst_bytes);
                memset(d_emu, SENTINEL, p.dst_bytes);
                memset(d_cpu, SENTINEL, p.dst_bytes);
                memset(d_mt, SENTINEL, p.dst_bytes);
                make_descs(&p, d_emu);
                ork_result rc = ork_mul_mat_id(emu, &p.tw, &p.tb, &p.tids, &p.tdst);
                CHECK(rc == ORK_OK, "%s K=%lld n_tokens=%lld emu: %u %s", t->name, (long long)k, (long long)p.n_tokens, rc, ork_last_error());
                make_descs(&p, d_cpu);
                rc = ork_mul_mat_id(cpu, &p.tw, &p.tb, &p.tids, &p.tdst);
                CHECK(rc == ORK_OK, "%s K=%lld n_tokens=%lld cpu: %u %s", t->name, (long long)k, (long long)p.n_tokens, rc, ork_last_error());
                int same = memcmp(d_emu, d_cpu, p.dst_bytes) == 0;
                CHECK(same, "%s K=%lld N=%lld n_tokens=%lld: emu and cpu dst differ", t->name, (long long)k, (long long)n, (long long)p.n_tokens);
                CHECK(padding_intact(&p, d_emu) && padding_intact(&p, d_cpu), "%s: bytes between dst rows were written", t->name);
                /* The entry point for callers' threads, on 3 threads, shared and led by thread 0, gives the
                   same bytes (one size per shape). */
                int mt_same = -1;
                if (p.n_tokens == 16) {
                    mt_same = 1;
                    ork_ctx *modes[2] = {emu, lead};
                    for (int m = 0; m < 2; m++) {
                        memset(d_mt, SENTINEL, p.dst_bytes);
                        make_descs(&p, d_mt);
                        rc = run_mt(modes[m], &p, 3);
                        CHECK(rc == ORK_OK, "%s mt %s: %u %s", t->name, m ? "leader" : "coop", rc, ork_last_error());
                        int same_m = memcmp(d_emu, d_mt, p.dst_bytes) == 0;
                        CHECK(same_m, "%s K=%lld: %s result differs", t->name, (long long)k, m ? "leader" : "cooperative");
                        mt_same &= same_m;
                    }
                }
                /* Reference experts: those of token 0 (eight distinct ones, usually the hot one). */
                dequant_expert refs[N_USED];
                for (int s = 0; s < N_USED; s++) {
                    refs[s].expert = *id_at(&p, 0, s);
                    refs[s].w = malloc((size_t)n * (size_t)k * sizeof(float));
                    dequant(&p, refs[s].expert, refs[s].w);
                }
                int rows_e = 0, rows_c = 0;
                double e_emu = nmse(&p, d_emu, refs, N_USED, quick ? 16 : 48, &rows_e);
                double e_cpu = nmse(&p, d_cpu, refs, N_USED, quick ? 16 : 48, &rows_c);
                for (int s = 0; s < N_USED; s++) free(refs[s].w);
                CHECK(e_emu <= GGML_NMSE_BOUND && e_cpu <= GGML_NMSE_BOUND, "%s K=%lld n_tokens=%lld: NMSE %.3g / %.3g above %.1g", t->name,
                      (long long)k, (long long)p.n_tokens, e_emu, e_cpu, GGML_NMSE_BOUND);
                CHECK(rows_e > 0, "no reference rows");
                printf("%-5s %5lld %5lld %8lld  %-9s %-4s %-11.3e %-11.3e %-9.1e %6d %6.2f\n", t->name, (long long)k, (long long)n, (long long)p.n_tokens,
                       same ? "yes" : "NO", mt_same < 0 ? "-" : mt_same ? "yes" : "NO", e_emu, e_cpu, GGML_NMSE_BOUND, rows_e, now_s() - t0);
                fflush(stdout);
                free(d_emu); free(d_cpu); free(d_mt);
            }
            free_problem(&p);
        }
    }
}

/* ---- bad input ---- */
static problem small;
static uint8_t *small_dst;

static void reset_small(void) {
    make_descs(&small, small_dst);
    memset(small_dst, SENTINEL, small.dst_bytes);
}

static int dst_untouched(void) {
    for (size_t i = 0; i < small.dst_bytes; i++)
        if (small_dst[i] != SENTINEL) return 0;
    return 1;
}

/* Calls the single-caller entry with the current descriptors (any may be swapped for NULL). */
static void expect(ork_ctx *ctx, const ork_tensor *w, const ork_tensor *b, const ork_tensor *ids, const ork_tensor *dst, ork_result want,
                   const char *msg_part, const char *what) {
    ork_result rc = ork_mul_mat_id(ctx, w, b, ids, dst);
    const char *msg = ork_last_error();
    CHECK(rc == want, "%s: code %u, want %u (%s)", what, rc, want, msg);
    CHECK(strstr(msg, msg_part) != NULL, "%s: message \"%s\" lacks \"%s\"", what, msg, msg_part);
    CHECK(dst_untouched(), "%s: dst was written", what);
    printf("  %-44s -> %u  \"%s\"\n", what, rc, msg);
}

/* `lead` is a context in ORK_MT_LEADER mode: failures reach every caller thread there too. */
static void bad_input(ork_ctx *ctx, ork_ctx *lead) {
    printf("bad input:\n");
    alloc_problem(&small, &TYPES[0], 64, 32, 4);
    small.n_tokens = 4;
    small_dst = malloc(4096 * 4);
    reset_small();
    route(&small);
    for (int64_t t = 0; t < small.n_tokens; t++)
        for (int s = 0; s < N_USED; s++) *id_at(&small, t, s) = (int32_t)((t * 8 + s) % N_EXPERT);
    fill_activations(&small);
    ork_tensor w = small.tw, b = small.tb, ids = small.tids, dst = small.tdst;
#define RESET() do { reset_small(); w = small.tw; b = small.tb; ids = small.tids; dst = small.tdst; } while (0)

    RESET(); expect(NULL, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "ctx is NULL", "NULL ctx");
    RESET(); expect(ctx, NULL, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "as: descriptor is NULL", "NULL as");
    RESET(); expect(ctx, &w, NULL, &ids, &dst, ORK_INVALID_ARGUMENT, "b: descriptor is NULL", "NULL b");
    RESET(); expect(ctx, &w, &b, NULL, &dst, ORK_INVALID_ARGUMENT, "ids: descriptor is NULL", "NULL ids");
    RESET(); expect(ctx, &w, &b, &ids, NULL, ORK_INVALID_ARGUMENT, "dst: descriptor is NULL", "NULL dst");
    RESET(); w.data = NULL; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "as: data is NULL", "NULL weight data");
    RESET(); b.data = NULL; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "b: data is NULL", "NULL activation data");
    RESET(); w.type = 9999; expect(ctx, &w, &b, &ids, &dst, ORK_NOT_HANDLED, "not supported", "unknown weight type 9999");
    RESET(); w.type = 30; expect(ctx, &w, &b, &ids, &dst, ORK_NOT_HANDLED, "not supported", "unsupported weight type BF16");
    RESET(); w.type = -3; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "not a ggml type", "negative type id");
    RESET(); ids.type = T_F32; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "must be I32", "ids not I32");
    RESET(); dst.type = T_F16; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "must be F32", "dst not F32");
    RESET(); b.type = T_F16; expect(ctx, &w, &b, &ids, &dst, ORK_NOT_HANDLED, "only F32", "F16 activations");
    RESET(); b.ne[0] = 32; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "but as has K", "b.ne[0] != K");
    RESET(); dst.ne[0] = 31; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "dst: ne", "dst.ne[0] != N");
    RESET(); ids.ne[1] = 3; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "tokens but ids has", "ids.ne[1] != b.ne[2]");
    RESET(); b.ne[1] = 3; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "does not divide", "b.ne[1] not dividing n_used");
    RESET(); *id_at(&small, 2, 3) = -1; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "ids[3, 2] = -1", "id < 0");
    *id_at(&small, 2, 3) = 19;
    RESET(); *id_at(&small, 3, 7) = N_EXPERT; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "ids[7, 3] = 128", "id >= n_expert");
    *id_at(&small, 3, 7) = 31;
    RESET(); w.ne[0] = b.ne[0] = 48; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "block size", "K not a multiple of the block");
    RESET(); w.type = T_Q4_K; w.nb[0] = 144; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "block size 256", "K=64 for Q4_K");
    RESET(); b.ne[2] = ids.ne[1] = dst.ne[2] = 0; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "at least 1", "zero tokens");
    RESET(); w.ne[1] = dst.ne[0] = 0; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "at least 1", "zero N");
    RESET(); w.ne[2] = (int64_t)1 << 40; w.nb[2] = (size_t)1 << 40; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "overflows", "huge n_expert");
    RESET(); b.ne[2] = ids.ne[1] = dst.ne[2] = INT64_MAX; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "", "INT64_MAX tokens");
    /* Layout codes: ggml's repacked tensors keep the plain ne and nb; rows must be whole groups
     * of packed rows, and a layout the library does not read is declined like an unknown type. */
    RESET(); w.type = ORK_TYPE_Q4_0_8X8;
    CHECK(ork_mul_mat_id_check(ctx, &w, &b, &ids, &dst) == ORK_OK, "check: q4_0_8x8 %s", ork_last_error());
    RESET(); w.type = ORK_TYPE_Q4_0_8X8; w.ne[1] = dst.ne[0] = 28;
    expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "8-row groups", "q4_0_8x8 with N = 28");
    RESET(); w.type = ORK_TYPE_Q4_0_4X4; w.nb[1] += 2; w.nb[2] += 64;
    expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "packed plain rows", "q4_0_4x4 with padded rows");
    RESET(); w.type = T_Q4_0 | 16 << ORK_LAYOUT_ROWS_SHIFT | 1 << ORK_LAYOUT_CHUNK_SHIFT;
    expect(ctx, &w, &b, &ids, &dst, ORK_NOT_HANDLED, "not supported", "unknown layout q4_0_16x1");
    RESET(); w.type = T_Q4_1 | 4 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
    expect(ctx, &w, &b, &ids, &dst, ORK_NOT_HANDLED, "not supported", "q4_1 never repacked");
    RESET(); dst.nb[2] = dst.nb[1]; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "overlap", "overlapping dst rows");
    RESET(); dst.data = b.data; expect(ctx, &w, &b, &ids, &dst, ORK_INVALID_ARGUMENT, "overlap", "dst aliasing b");

    /* Same rejections through the metadata check and the cooperative entry (every thread agrees). */
    RESET(); w.type = 9999;
    CHECK(ork_mul_mat_id_check(ctx, &w, &b, &ids, &dst) == ORK_NOT_HANDLED, "check: unknown type");
    RESET();
    CHECK(ork_mul_mat_id_check(ctx, &w, &b, &ids, &dst) == ORK_OK, "check: valid call %s", ork_last_error());
    {
        *id_at(&small, 1, 1) = 500;
        ork_result rc = 0;
        for (int m = 0; m < 2; m++) {
            RESET();
            rc = run_mt(m ? lead : ctx, &small, 3);
            CHECK(rc == ORK_INVALID_ARGUMENT, "mt (%s) with a bad id: %u", m ? "leader" : "coop", rc);
            CHECK(dst_untouched(), "mt with a bad id wrote dst");
            printf("  %-44s -> %u\n", m ? "led call with id 500 (3 threads)" : "cooperative call with id 500 (3 threads)", rc);
        }
        *id_at(&small, 1, 1) = 9;
        ork_threads th = {0, 2, NULL, NULL, NULL, 0};
        RESET();
        rc = ork_mul_mat_id_mt(ctx, &w, &b, &ids, &dst, &th);
        CHECK(rc == ORK_INVALID_ARGUMENT && strstr(ork_last_error(), "barrier is NULL"), "NULL barrier: %u %s", rc, ork_last_error());
        th = (ork_threads){2, 2, barrier_cb, NULL, NULL, 0};
        rc = ork_mul_mat_id_mt(ctx, &w, &b, &ids, &dst, &th);
        CHECK(rc == ORK_INVALID_ARGUMENT && strstr(ork_last_error(), "out of range"), "ith == nth: %u %s", rc, ork_last_error());
        CHECK(ork_mul_mat_id_mt(ctx, &w, &b, &ids, &dst, NULL) == ORK_INVALID_ARGUMENT, "NULL threads");
        CHECK(dst_untouched(), "invalid thread descriptors wrote dst");
    }

    /* NaN/Inf activations: defined result. Every output of a row holding one is NaN; the other
     * rows are exactly what they are without it. */
    {
        RESET();
        CHECK(ork_mul_mat_id(ctx, &w, &b, &ids, &dst) == ORK_OK, "clean run: %s", ork_last_error());
        uint8_t *clean = malloc(small.dst_bytes);
        memcpy(clean, small_dst, small.dst_bytes);
        float *x1 = (float *)b_row(&small, 1, 0), *x2 = (float *)b_row(&small, 2, 5);
        float save1 = x1[7], save2 = x2[0];
        x1[7] = NAN;
        x2[0] = -INFINITY;
        RESET();
        ork_result rc = ork_mul_mat_id(ctx, &w, &b, &ids, &dst);
        CHECK(rc == ORK_OK, "NaN/Inf activations: %u %s", rc, ork_last_error());
        int ok = 1;
        for (int64_t t = 0; t < small.n_tokens; t++)
            for (int s = 0; s < N_USED; s++) {
                const float *y = dst_at(&small, small_dst, t, s), *c = dst_at(&small, clean, t, s);
                int poisoned = (b_row(&small, t, s) == x1) || (b_row(&small, t, s) == x2);
                for (int64_t j = 0; j < small.n; j++)
                    ok &= poisoned ? isnan(y[j]) : memcmp(&y[j], &c[j], 4) == 0;
            }
        CHECK(ok, "NaN/Inf activations: not the defined result");
        printf("  %-44s -> %u  (rows with NaN/Inf all NaN, others unchanged: %s)\n", "NaN and -Inf activations", rc, ok ? "yes" : "NO");
        x1[7] = save1;
        x2[0] = save2;
        free(clean);
    }

    /* A NaN weight scale is reported (it is only seen while inflating). */
    {
        uint8_t *blk = small.w + (size_t)9 * small.tw.nb[2]; /* row 0, block 0: always fingerprinted */
        uint8_t save[2] = {blk[0], blk[1]};
        put_half(blk, 0x7e00);
        RESET();
        ork_result rc = ork_mul_mat_id(ctx, &w, &b, &ids, &dst);
        CHECK(rc == ORK_INVALID_ARGUMENT && strstr(ork_last_error(), "NaN or infinite scale"), "NaN weight scale: %u %s", rc, ork_last_error());
        printf("  %-44s -> %u  \"%s\"\n", "NaN fp16 scale in expert 9", rc, ork_last_error());
        for (int m = 0; m < 2; m++) {
            RESET();
            rc = run_mt(m ? lead : ctx, &small, 3);
            CHECK(rc == ORK_INVALID_ARGUMENT, "NaN weight scale, mt (%s): %u", m ? "leader" : "coop", rc);
        }
        blk[0] = save[0];
        blk[1] = save[1];
    }

    ork_ctx_free(NULL);
    ork_ctx_free(NULL);
    CHECK(ork_ctx_new(&(ork_config){.struct_size = 2}) == NULL && strstr(ork_last_error(), "struct_size"), "tiny struct_size accepted");
    {
        ork_config cfg = {.struct_size = sizeof(ork_config)};
        ork_config_default(&cfg);
        cfg.backend = 42;
        CHECK(ork_ctx_new(&cfg) == NULL && strstr(ork_last_error(), "unknown backend"), "backend 42 accepted");
        ork_config_default(&cfg);
        cfg.mt_mode = 7;
        CHECK(ork_ctx_new(&cfg) == NULL && strstr(ork_last_error(), "unknown mt_mode"), "mt_mode 7 accepted");
        /* An older, shorter config: the missing fields take their defaults. */
        ork_config_default(&cfg);
        cfg.struct_size = (uint32_t)offsetof(ork_config, min_rows_mode);
        cfg.backend = ORK_BACKEND_CPU;
        ork_ctx *old = ork_ctx_new(&cfg);
        CHECK(old != NULL, "short config: %s", ork_last_error());
        ork_ctx_free(old);
    }
    CHECK(ork_ctx_stats(NULL, NULL) == ORK_INVALID_ARGUMENT, "stats with NULL ctx");
    printf("  ork_ctx_free(NULL) twice: no-op\n");
#undef RESET
    free(small_dst);
    free_problem(&small);
}

static void *fresh_thread_error(void *out) {
    *(int *)out = ork_last_error()[0] == '\0';
    return NULL;
}

/* Small batches: declined by default, or run on the CPU with the same bytes as the device path. */
static void small_batch(void) {
    problem p;
    alloc_problem(&p, &TYPES[4], 2048, 768, 1);
    route(&p);
    fill_activations(&p);
    uint8_t *d_dev = malloc(p.dst_bytes), *d_small = malloc(p.dst_bytes);
    ork_ctx *dev = new_ctx(ORK_BACKEND_EMU, 0, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP);
    ork_ctx *decline = new_ctx(ORK_BACKEND_EMU, 4, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP);
    ork_ctx *cpu = new_ctx(ORK_BACKEND_EMU, 4, ORK_MIN_ROWS_CPU, ORK_MT_COOP);
    memset(d_dev, SENTINEL, p.dst_bytes);
    make_descs(&p, d_dev);
    CHECK(ork_mul_mat_id(dev, &p.tw, &p.tb, &p.tids, &p.tdst) == ORK_OK, "decode on the device: %s", ork_last_error());
    memset(d_small, SENTINEL, p.dst_bytes);
    make_descs(&p, d_small);
    ork_result rc = ork_mul_mat_id(decline, &p.tw, &p.tb, &p.tids, &p.tdst);
    CHECK(rc == ORK_NOT_HANDLED && strstr(ork_last_error(), "min_rows"), "decode below min_rows: %u %s", rc, ork_last_error());
    CHECK(ork_mul_mat_id_check(decline, &p.tw, &p.tb, &p.tids, &p.tdst) == ORK_NOT_HANDLED, "check: decode below min_rows");
    int untouched = 1;
    for (size_t i = 0; i < p.dst_bytes; i++) untouched &= d_small[i] == SENTINEL;
    CHECK(untouched, "declined call wrote dst");
    rc = ork_mul_mat_id(cpu, &p.tw, &p.tb, &p.tids, &p.tdst);
    CHECK(rc == ORK_OK, "decode on the CPU path: %u %s", rc, ork_last_error());
    CHECK(memcmp(d_dev, d_small, p.dst_bytes) == 0, "CPU small-batch path differs from the device path");
    ork_stats s_dec, s_cpu;
    ork_ctx_stats(decline, &s_dec);
    ork_ctx_stats(cpu, &s_cpu);
    CHECK(s_dec.declined == 1 && s_dec.handled == 0, "decline stats");
    CHECK(s_cpu.cpu_gemms == 8 && s_cpu.handled == 1 && s_cpu.submits_stream + s_cpu.submits_run_i8 == 0, "cpu path stats");
    printf("small batch (n_tokens=1, min_rows=4): decline -> %u, cpu mode == device path: %s\n", ORK_NOT_HANDLED,
           memcmp(d_dev, d_small, p.dst_bytes) == 0 ? "yes" : "NO");
    ork_ctx_free(dev); ork_ctx_free(decline); ork_ctx_free(cpu);
    free(d_dev); free(d_small);
    free_problem(&p);
}

/* A pair (a MoE FFN's gate and up: two weight sets, one input) gives the bytes of its two calls;
 * weights of another shape are NOT_HANDLED, outputs that overlap INVALID_ARGUMENT. */
static void pair_calls(ork_ctx *emu) {
    problem p, q;
    alloc_problem(&p, &TYPES[4], 2048, 96, 16); /* q4_K, N not a multiple of 64 */
    alloc_problem(&q, &TYPES[4], 2048, 96, 16);
    route(&p);
    fill_activations(&p);
    uint8_t *d[4];
    make_descs(&p, NULL);
    for (int i = 0; i < 4; i++) {
        d[i] = malloc(p.dst_bytes);
        memset(d[i], SENTINEL, p.dst_bytes);
    }
    ork_tensor w1 = p.tw, d0, d1;
    w1.data = q.w;
    make_descs(&p, d[0]);
    CHECK(ork_mul_mat_id(emu, &p.tw, &p.tb, &p.tids, &p.tdst) == ORK_OK, "pair: single gate %s", ork_last_error());
    make_descs(&p, d[1]);
    CHECK(ork_mul_mat_id(emu, &w1, &p.tb, &p.tids, &p.tdst) == ORK_OK, "pair: single up %s", ork_last_error());
    make_descs(&p, d[2]);
    d0 = p.tdst;
    make_descs(&p, d[3]);
    d1 = p.tdst;
    CHECK(ork_mul_mat_id_pair_check(emu, &p.tw, &w1, &p.tb, &p.tids, &d0, &d1) == ORK_OK, "pair check: %s", ork_last_error());
    ork_result rc = ork_mul_mat_id_pair(emu, &p.tw, &w1, &p.tb, &p.tids, &d0, &d1);
    CHECK(rc == ORK_OK, "pair: %u %s", rc, ork_last_error());
    CHECK(memcmp(d[0], d[2], p.dst_bytes) == 0 && memcmp(d[1], d[3], p.dst_bytes) == 0, "pair differs from its two calls");
    ork_tensor other = w1;
    other.ne[1] = 64;
    CHECK(ork_mul_mat_id_pair_check(emu, &p.tw, &other, &p.tb, &p.tids, &d0, &d1) == ORK_INVALID_ARGUMENT ||
              ork_mul_mat_id_pair_check(emu, &p.tw, &other, &p.tb, &p.tids, &d0, &d1) == ORK_NOT_HANDLED,
          "pair of two shapes: %s", ork_last_error());
    other = w1;
    other.type = ORK_TYPE_Q4_K_8X8;
    rc = ork_mul_mat_id_pair_check(emu, &p.tw, &other, &p.tb, &p.tids, &d0, &d1);
    CHECK(rc == ORK_NOT_HANDLED && strstr(ork_last_error(), "one type, layout and shape"), "pair of two layouts: %u %s", rc,
          ork_last_error());
    memset(d[3], SENTINEL, p.dst_bytes);
    rc = ork_mul_mat_id_pair(emu, &p.tw, &w1, &p.tb, &p.tids, &d0, &d0);
    CHECK(rc == ORK_INVALID_ARGUMENT && strstr(ork_last_error(), "overlaps"), "pair into one dst: %u %s", rc, ork_last_error());
    printf("pair: gate+up in one call == two calls\n");
    for (int i = 0; i < 4; i++) free(d[i]);
    free_problem(&p);
    free_problem(&q);
}

/* Prefetch: a pair announced with ork_prefetch, inflated by the library's threads while this thread waits,
 * then called: the same bits as the pair without prefetch; the fence releases the weights. */
static void prefetch_calls(ork_ctx *emu) {
    ork_config cfg = {.struct_size = sizeof(ork_config)};
    ork_config_default(&cfg);
    const char *env = getenv("ORK_PREFETCH");
    CHECK((env && *env && strcmp(env, "auto") != 0) || cfg.prefetch_threads == ORK_PREFETCH_AUTO,
          "default prefetch_threads %u, not ORK_PREFETCH_AUTO", cfg.prefetch_threads);
    cfg.backend = ORK_BACKEND_EMU;
    cfg.min_rows = 0;
    cfg.cache_bytes = 0; /* every expert comes from the prefetch or from the call */
    cfg.prefetch_threads = 2;
    cfg.dispatch = ORK_DISPATCH_ALWAYS;
    ork_ctx *pf = ork_ctx_new(&cfg);
    CHECK(pf != NULL, "prefetch context: %s", ork_last_error());
    if (!pf) return;
    problem p, q;
    alloc_problem(&p, &TYPES[0], 2048, 768, 64);
    alloc_problem(&q, &TYPES[0], 2048, 768, 64);
    route(&p);
    fill_activations(&p);
    uint8_t *d[4];
    for (int i = 0; i < 4; i++) {
        d[i] = malloc(p.dst_bytes);
        memset(d[i], SENTINEL, p.dst_bytes);
    }
    ork_tensor w1 = p.tw, d0, d1, e0, e1;
    w1.data = q.w;
    make_descs(&p, d[0]);
    d0 = p.tdst;
    make_descs(&p, d[1]);
    d1 = p.tdst;
    make_descs(&p, d[2]);
    e0 = p.tdst;
    make_descs(&p, d[3]);
    e1 = p.tdst;
    CHECK(ork_mul_mat_id_pair(emu, &p.tw, &w1, &p.tb, &p.tids, &d0, &d1) == ORK_OK, "pair: %s", ork_last_error());
    ork_result rc = ork_prefetch(pf, &p.tw, &w1, &p.tb, &p.tids, &e0, &e1);
    CHECK(rc == ORK_OK, "prefetch: %u %s", rc, ork_last_error());
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL); /* let the prefetch threads work ahead */
    CHECK(ork_mul_mat_id_pair(pf, &p.tw, &w1, &p.tb, &p.tids, &e0, &e1) == ORK_OK, "prefetched pair: %s", ork_last_error());
    CHECK(memcmp(d[0], d[2], p.dst_bytes) == 0 && memcmp(d[1], d[3], p.dst_bytes) == 0, "prefetched pair differs");
    CHECK(ork_prefetch_fence(pf) == ORK_OK, "fence: %s", ork_last_error());
    CHECK(ork_prefetch(NULL, &p.tw, &w1, &p.tb, &p.tids, &e0, &e1) == ORK_INVALID_ARGUMENT, "prefetch with NULL ctx");
    CHECK(ork_prefetch(pf, NULL, NULL, &p.tb, &p.tids, &e0, NULL) == ORK_INVALID_ARGUMENT, "prefetch with NULL as");
    CHECK(ork_prefetch(pf, &p.tw, &w1, &p.tb, &p.tids, &e0, NULL) == ORK_INVALID_ARGUMENT, "prefetch of a pair without dst1");
    CHECK(ork_prefetch_fence(NULL) == ORK_INVALID_ARGUMENT, "fence with NULL ctx");
    printf("prefetch: an announced pair gives the pair's bits\n");
    ork_ctx_free(pf);
    for (int i = 0; i < 4; i++) free(d[i]);
    free_problem(&p);
    free_problem(&q);
}

/* A dense matmul (ggml's MUL_MAT of a weight matrix: a prompt's attention projection) gives the bytes of the
 * routed call with one expert and one slot that every token routes to; batched activations and a context
 * with dense = 0 are NOT_HANDLED, a dst of the wrong shape INVALID_ARGUMENT. */
static void dense_calls(ork_ctx *emu) {
    problem p;
    alloc_problem(&p, &TYPES[4], 2048, 96, 24); /* q4_K */
    fill_activations(&p);
    make_descs(&p, NULL);
    const int64_t k = p.k, n = p.n, t = p.n_tokens;
    const size_t dnb1 = (size_t)n * 4 + 16, dst_bytes = dnb1 * (size_t)t;
    uint8_t *d[2];
    for (int i = 0; i < 2; i++) {
        d[i] = malloc(dst_bytes);
        memset(d[i], SENTINEL, dst_bytes);
    }
    int32_t *zeros = calloc((size_t)t, sizeof *zeros);
    ork_tensor a = p.tw;
    a.ne[2] = 1;
    a.nb[3] = a.nb[2] = a.nb[1] * (size_t)n;
    const size_t bnb = p.tb.nb[2]; /* one activation row per token */
    ork_tensor b = {T_F32, {k, t, 1, 1}, {4, bnb, bnb * (size_t)t, bnb * (size_t)t}, p.b, NULL};
    ork_tensor dst = {T_F32, {n, t, 1, 1}, {4, dnb1, dnb1 * (size_t)t, dnb1 * (size_t)t}, d[0], NULL};
    CHECK(ork_mul_mat_check(emu, &a, &b, &dst) == ORK_OK, "dense check: %s", ork_last_error());
    ork_result rc = ork_mul_mat(emu, &a, &b, &dst);
    CHECK(rc == ORK_OK, "dense: %u %s", rc, ork_last_error());
    ork_tensor rb = {T_F32, {k, 1, t, 1}, {4, bnb, bnb, bnb * (size_t)t}, p.b, NULL};
    ork_tensor ids = {T_I32, {1, t, 1, 1}, {4, 4, 4 * (size_t)t, 4 * (size_t)t}, zeros, NULL};
    ork_tensor rdst = {T_F32, {n, 1, t, 1}, {4, dnb1, dnb1, dnb1 * (size_t)t}, d[1], NULL};
    CHECK(ork_mul_mat_id(emu, &a, &rb, &ids, &rdst) == ORK_OK, "dense as routed: %s", ork_last_error());
    CHECK(memcmp(d[0], d[1], dst_bytes) == 0, "dense differs from the routed call of one expert");
    ork_tensor batched = b;
    batched.ne[1] = t / 2, batched.ne[2] = 2;
    rc = ork_mul_mat_check(emu, &a, &batched, &dst);
    CHECK(rc == ORK_NOT_HANDLED && strstr(ork_last_error(), "batched"), "batched dense: %u %s", rc, ork_last_error());
    ork_tensor narrow = dst;
    narrow.ne[0] = n / 2;
    CHECK(ork_mul_mat_check(emu, &a, &b, &narrow) == ORK_INVALID_ARGUMENT, "dense into a narrow dst: %s", ork_last_error());
    ork_config cfg = {.struct_size = sizeof(ork_config)};
    ork_config_default(&cfg);
    cfg.backend = ORK_BACKEND_EMU;
    cfg.dispatch = ORK_DISPATCH_ALWAYS; /* every call taken: nothing left to time ggml */
    cfg.min_rows = 0;
    cfg.dense = 0;
    ork_ctx *off = ork_ctx_new(&cfg);
    CHECK(off != NULL, "dense = 0 context: %s", ork_last_error());
    if (off) {
        CHECK(ork_mul_mat_check(off, &a, &b, &dst) == ORK_NOT_HANDLED, "dense = 0 still takes dense calls");
        ork_ctx_free(off);
    }
    printf("dense: a weight matrix's matmul == the routed call of one expert\n");
    for (int i = 0; i < 2; i++) free(d[i]);
    free(zeros);
    free_problem(&p);
}

/* ORK_DISPATCH=auto as a patched llama.cpp drives it: after each call the library declined, ggml runs the op and
 * reports its time (ork_observe). ggml's path tried twice, the library's four times (its two warm-up calls give no
 * time), then the verdict: every call taken when ggml reports far more time than the library's path takes, every call
 * declined when it reports none. All threads of a call return one code (run_mt gives 99 otherwise). */
static void dispatch_calls(void) {
    problem p;
    alloc_problem(&p, &TYPES[0], 256, 64, 64);
    route(&p);
    fill_activations(&p);
    uint8_t *dst = malloc(p.dst_bytes);
    make_descs(&p, dst);
    const double ggml_seconds[2] = {1000.0, 0.0};
    for (int slow = 0; slow < 2; slow++) {
        ork_config cfg = {.struct_size = sizeof(ork_config)};
        ork_config_default(&cfg);
        cfg.backend = ORK_BACKEND_EMU;
        cfg.min_rows = 0;
        cfg.dispatch = ORK_DISPATCH_AUTO;
        ork_ctx *ctx = ork_ctx_new(&cfg);
        if (!ctx) {
            fprintf(stderr, "ork_ctx_new(dispatch auto): %s\n", ork_last_error());
            exit(2);
        }
        char codes[33] = {0};
        for (int i = 0; i < 32; i++) {
            memset(dst, SENTINEL, p.dst_bytes);
            ork_result rc = run_mt(ctx, &p, 4);
            codes[i] = (char)('0' + rc);
            if (rc == ORK_NOT_HANDLED) {
                ork_result o = ork_observe(ctx, &p.tw, NULL, &p.tb, &p.tids, &p.tdst, NULL, ggml_seconds[slow]);
                CHECK(o == ORK_OK, "ork_observe: %u %s", o, ork_last_error());
            }
        }
        const char *want = slow == 0 ? "11000000000000000000000000000000" : "11000011111111111111111111111111";
        CHECK(strcmp(codes, want) == 0, "dispatch with ggml at %g s: codes %s, want %s", ggml_seconds[slow], codes, want);
        printf("dispatch auto, ggml reports %g s per call: %s\n", ggml_seconds[slow], codes);
        CHECK(ork_observe(ctx, &p.tw, NULL, &p.tb, &p.tids, &p.tdst, NULL, -1.0) == ORK_INVALID_ARGUMENT, "negative time taken");
        ork_ctx_free(ctx);
    }
    free(dst);
    free_problem(&p);
}

int main(void) {
    /* The dispatch case starts undecided: no verdict an earlier run remembered (before any thread reads the
     * environment). */
    setenv("ORK_DISPATCH_CACHE", "off", 1);
    int quick = getenv("QUICK") && atoi(getenv("QUICK")) != 0;
    printf("ork_moe %s, ABI %u (header %d)\n", ork_version(), ork_abi_version(), ORK_ABI_VERSION);
    CHECK(ork_abi_version() == ORK_ABI_VERSION, "ABI version mismatch");
    CHECK(strcmp(ork_version(), "0.1.0") == 0, "version %s", ork_version());
    CHECK(ork_supports_type(T_Q4_0) == 1 && ork_supports_type(T_Q6_K) == 1, "supports_type quantized");
    CHECK(ork_supports_type(T_F32) == 0 && ork_supports_type(30) == 0 && ork_supports_type(-1) == 0, "supports_type others");
    {
        static const int32_t LAYOUTS[] = {ORK_TYPE_Q4_0_4X4, ORK_TYPE_Q4_0_4X8, ORK_TYPE_Q4_0_8X8, ORK_TYPE_Q8_0_4X4, ORK_TYPE_Q8_0_4X8,
                                          ORK_TYPE_Q4_K_8X4, ORK_TYPE_Q4_K_8X8, ORK_TYPE_Q6_K_8X4, ORK_TYPE_Q6_K_8X8};
        for (size_t i = 0; i < sizeof LAYOUTS / sizeof LAYOUTS[0]; i++) {
            CHECK(ork_supports_type(LAYOUTS[i]) == 1, "supports_type layout %#x", (unsigned)LAYOUTS[i]);
        }
        CHECK(ork_supports_type(T_Q4_0 | 16 << ORK_LAYOUT_ROWS_SHIFT | 1 << ORK_LAYOUT_CHUNK_SHIFT) == 0, "supports_type q4_0_16x1");
        CHECK(ork_supports_type(T_Q5_0 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT) == 0, "supports_type q5_0_8x8");
        CHECK(ORK_TYPE_Q4_0_8X8 == (T_Q4_0 | 8 << 16 | 8 << 24), "layout code encoding");
    }
    {
        pthread_t th;
        int fresh = 0;
        pthread_create(&th, NULL, fresh_thread_error, &fresh);
        pthread_join(th, NULL);
        CHECK(fresh, "ork_last_error is not empty on a fresh thread");
    }

    ork_ctx *emu = new_ctx(ORK_BACKEND_EMU, 0, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP);
    ork_ctx *cpu = new_ctx(ORK_BACKEND_CPU, 0, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP);
    ork_ctx *lead = new_ctx(ORK_BACKEND_EMU, 0, ORK_MIN_ROWS_DECLINE, ORK_MT_LEADER);
    double t0 = now_s();
    run_matrix(emu, cpu, lead, quick);
    printf("matrix: %.1f s\n", now_s() - t0);
    small_batch();
    pair_calls(emu);
    prefetch_calls(emu);
    dense_calls(emu);
    dispatch_calls();
    bad_input(emu, lead);

    ork_stats st;
    CHECK(ork_ctx_stats(emu, &st) == ORK_OK, "stats");
    printf("emu stats: calls %llu handled %llu declined %llu rows %llu inflated %llu hits %llu misses %llu evictions %llu "
           "stream %llu run_i8 %llu modelled %.0f us backend %d\n",
           (unsigned long long)st.calls, (unsigned long long)st.handled, (unsigned long long)st.declined, (unsigned long long)st.rows,
           (unsigned long long)st.experts_inflated, (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses,
           (unsigned long long)st.cache_evictions, (unsigned long long)st.submits_stream, (unsigned long long)st.submits_run_i8,
           st.modelled_npu_us, st.backend);
    CHECK(st.backend == ORK_BACKEND_EMU && st.handled > 0 && st.cache_hits > 0 && st.submits_stream > 0 && st.submits_run_i8 > 0,
          "emu stats do not show the work");
    ork_ctx_free(emu);
    ork_ctx_free(cpu);
    ork_ctx_free(lead);
    if (failures) {
        printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
