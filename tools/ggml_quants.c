// ggml's reference dequantization and quantizers (ggml/src/ggml-quants.c of the pinned llama.cpp,
// compiled alone by tools/ggml_quants.sh, no llama.cpp build), for the quant layer's tests:
//
//   ggml_quants dequantize TYPE IN.blocks OUT.f32
//       ggml's dequantize_row_<type> of every block.
//   ggml_quants weights TYPE K ROWS SEED OUT.blocks
//       ROWS/2 rows of N(0, 1) then ROWS/2 rows of U(-1, 1) (test-backend-ops' weights), K values
//       each, quantized by ggml's quantize_<type> with an importance matrix of ones (as
//       test-backend-ops does; the IQ2/IQ1 types require one).
#include "ggml-quants.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*dequantize_fn)(const void *, float *, int64_t);
typedef size_t (*quantize_fn)(const float *, void *, int64_t, int64_t, const float *);

static const struct type {
    const char *name;
    enum ggml_type type;
    int64_t elems;
    size_t bytes;
    dequantize_fn dequantize;
    quantize_fn quantize;
} TYPES[] = {
#define T(TYPE, name, elems, bytes) {#name, GGML_TYPE_##TYPE, elems, bytes, (dequantize_fn)dequantize_row_##name, quantize_##name}
    T(Q4_0, q4_0, 32, 18), T(Q4_1, q4_1, 32, 20), T(Q5_0, q5_0, 32, 22), T(Q5_1, q5_1, 32, 24),
    T(Q8_0, q8_0, 32, 34), T(Q2_K, q2_K, 256, 84), T(Q3_K, q3_K, 256, 110), T(Q4_K, q4_K, 256, 144),
    T(Q5_K, q5_K, 256, 176), T(Q6_K, q6_K, 256, 210), T(IQ2_XXS, iq2_xxs, 256, 66),
    T(IQ2_XS, iq2_xs, 256, 74), T(IQ2_S, iq2_s, 256, 82), T(IQ3_XXS, iq3_xxs, 256, 98),
    T(IQ3_S, iq3_s, 256, 110), T(IQ1_S, iq1_s, 256, 50), T(IQ1_M, iq1_m, 256, 56),
    T(IQ4_NL, iq4_nl, 32, 18), T(IQ4_XS, iq4_xs, 256, 136), T(MXFP4, mxfp4, 32, 17),
#undef T
};
#define N_TYPES (sizeof TYPES / sizeof *TYPES)

static const struct type *by_type(enum ggml_type t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (TYPES[i].type == t) return &TYPES[i];
    return NULL;
}

static const struct type *by_name(const char *name) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (!strcmp(TYPES[i].name, name)) return &TYPES[i];
    fprintf(stderr, "unknown type %s\n", name);
    exit(2);
}

// What ggml-quants.c calls from ggml.c.
void ggml_abort(const char *file, int line, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s:%d: ", file, line);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    abort();
}
size_t ggml_type_size(enum ggml_type t) { return by_type(t)->bytes; }
int64_t ggml_blck_size(enum ggml_type t) { return by_type(t)->elems; }
size_t ggml_row_size(enum ggml_type t, int64_t ne) { return by_type(t)->bytes * (size_t)(ne / by_type(t)->elems); }
const char *ggml_type_name(enum ggml_type t) { return by_type(t)->name; }

static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(*len ? *len : 1);
    if (fread(buf, 1, *len, f) != *len) { perror(path); exit(1); }
    fclose(f);
    return buf;
}

static void write_file(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) { perror(path); exit(1); }
}

// SplitMix64, uniform in [0, 1) and Box-Muller: deterministic weights on every machine.
static uint64_t state;
static double unit(void) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}
static double normal(void) { return sqrt(-2.0 * log(1.0 - unit())) * cos(2.0 * M_PI * unit()); }

static void init_grids(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M:
        iq2xs_init_impl(t);
        break;
    case GGML_TYPE_IQ3_XXS: iq3xs_init_impl(256); break;
    case GGML_TYPE_IQ3_S: iq3xs_init_impl(512); break;
    default: break;
    }
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "dequantize")) {
        const struct type *t = by_name(argv[2]);
        size_t len;
        void *blocks = read_file(argv[3], &len);
        int64_t n = (int64_t)(len / t->bytes) * t->elems;
        float *out = malloc((size_t)n * sizeof(float) + 1);
        t->dequantize(blocks, out, n);
        write_file(argv[4], out, (size_t)n * sizeof(float));
        return 0;
    }
    if (argc == 7 && !strcmp(argv[1], "weights")) {
        const struct type *t = by_name(argv[2]);
        int64_t k = atol(argv[3]), rows = atol(argv[4]);
        state = strtoull(argv[5], NULL, 10);
        if (k <= 0 || k % t->elems || rows <= 0 || rows % 2) { fprintf(stderr, "bad K or ROWS\n"); return 2; }
        float *x = malloc((size_t)(k * rows) * sizeof(float)), *ones = malloc((size_t)k * sizeof(float));
        for (int64_t i = 0; i < k * rows; i++) x[i] = (float)(i < k * rows / 2 ? normal() : 2.0 * unit() - 1.0);
        for (int64_t i = 0; i < k; i++) ones[i] = 1.0f;
        void *q = malloc(ggml_row_size(t->type, k) * (size_t)rows);
        init_grids(t->type);
        size_t len = t->quantize(x, q, rows, k, ones);
        write_file(argv[6], q, len);
        return 0;
    }
    fprintf(stderr, "usage: ggml_quants dequantize TYPE IN.blocks OUT.f32 | weights TYPE K ROWS SEED OUT.blocks\n");
    return 2;
}
