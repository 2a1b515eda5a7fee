// ggml's own quantizers and dot products, called from the pinned, built ggml (libggml-base,
// libggml-cpu), as the oracle for src/quant/vec_dot.rs and for quantizing test weights.
//
//   bash tools/ggml_oracle.sh vectors tests/data/accuracy/oracle
//       For each weight type: random f32 activations (with ties, an outlier, a zero and a tiny
//       block) and weights quantized by ggml_quantize_chunk; writes
//         <type>.x.f32       rows x k activations
//         <type>.w.blocks    rows x k weights (ggml blocks)
//         <type>.act_ref     activations quantized by quantize_row_q8_{0,1,K}_ref (ggml's reference)
//         <type>.act_simd    ... by the built CPU backend's from_float (the SIMD path this build runs)
//         <type>.dot_ref     f32 dot[i][j] = ggml_vec_dot_<type>_q8_*_generic(w row i, act_ref row j),
//                            the generic C compiled without fused multiply-adds
//         <type>.dot_simd    f32 dot[i][j] = the built backend's vec_dot(w row i, act_simd row j)
//   bash tools/ggml_oracle.sh quantize TYPE K IN.f32 OUT.blocks
//       quantizes rows of K f32 values with ggml_quantize_chunk (no importance matrix: what
//       llama-quantize does for these types without --imatrix).
//
// Only ggml's public entry points and its exported reference functions are called; the generic
// dot products come from ggml-cpu/quants.c compiled into this program (see ggml_oracle.sh).
#include <ggml.h>
#include <ggml-cpu.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Exported by libggml-base (ggml-quants.c) and libggml-cpu (ggml-cpu/quants.c); block pointers
// are passed as void *.
void quantize_row_q8_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_1_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k);
typedef void (*vec_dot_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void ggml_vec_dot_q4_0_q8_0_generic(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q4_1_q8_1_generic(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q5_0_q8_0_generic(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q8_0_q8_0_generic(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q4_K_q8_K_generic(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q6_K_q8_K_generic(int, float *, size_t, const void *, size_t, const void *, size_t, int);

struct case_type {
    const char *name;
    enum ggml_type type;
    void (*act_ref)(const float *, void *, int64_t);
    vec_dot_fn dot_ref;
};

static const struct case_type TYPES[] = {
    {"q4_0", GGML_TYPE_Q4_0, quantize_row_q8_0_ref, ggml_vec_dot_q4_0_q8_0_generic},
    {"q4_1", GGML_TYPE_Q4_1, quantize_row_q8_1_ref, ggml_vec_dot_q4_1_q8_1_generic},
    {"q5_0", GGML_TYPE_Q5_0, quantize_row_q8_0_ref, ggml_vec_dot_q5_0_q8_0_generic},
    {"q8_0", GGML_TYPE_Q8_0, quantize_row_q8_0_ref, ggml_vec_dot_q8_0_q8_0_generic},
    {"q4_K", GGML_TYPE_Q4_K, quantize_row_q8_K_ref, ggml_vec_dot_q4_K_q8_K_generic},
    {"q6_K", GGML_TYPE_Q6_K, quantize_row_q8_K_ref, ggml_vec_dot_q6_K_q8_K_generic},
};

enum { ROWS = 8, K = 512 };

static uint64_t state = 20261201;
static double uniform(void) { // splitmix64 -> [0, 1)
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static void write_file(const char *dir, const char *name, const char *ext, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "ggml_oracle: cannot write %s\n", path);
        exit(1);
    }
}

// Activation row r: uniform in [-1, 1] on a grid of 1/64 (many exact ties after scaling),
// row 1 with an outlier of 40 at channel 7, row 2 with a zero block, row 3 all tiny (1e-40),
// row 4 Gaussian-like with a sign-varying large block.
static void make_x(float *x) {
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < K; i++) {
            double u = 2.0 * uniform() - 1.0;
            x[r * K + i] = (r % 2 == 0) ? (float)(u * 3.0) : (float)((int)(u * 64.0) / 64.0);
        }
    }
    x[1 * K + 7] = 40.0f;
    memset(&x[2 * K + 256], 0, 256 * sizeof(float));
    for (int i = 0; i < K; i++) x[3 * K + i] = (i % 3 ? 1e-40f : -1e-40f);
    for (int i = 0; i < 32; i++) x[4 * K + 288 + i] *= (i % 2 ? -100.0f : 100.0f);
}

static int vectors(const char *dir) {
    static float x[ROWS * K], w[ROWS * K], dot_ref[ROWS * ROWS], dot_simd[ROWS * ROWS];
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        const struct case_type *c = &TYPES[t];
        const struct ggml_type_traits_cpu *cpu = ggml_get_type_traits_cpu(c->type);
        const struct ggml_type_traits_cpu *act = ggml_get_type_traits_cpu(cpu->vec_dot_type);
        const size_t wrow = ggml_row_size(c->type, K), arow = ggml_row_size(cpu->vec_dot_type, K);
        make_x(x);
        for (int i = 0; i < ROWS * K; i++) {
            double u = 2.0 * uniform() - 1.0;
            w[i] = (float)(u * u * u * 0.1); // heavy-ish tails
        }
        // Zeroed: quantize_row_q8_K_ref leaves the bsums of an all-zero block unwritten (harmless: d = 0).
        char *wq = calloc(ROWS, wrow), *aref = calloc(ROWS, arow), *asimd = calloc(ROWS, arow);
        ggml_quantize_chunk(c->type, w, wq, 0, ROWS, K, NULL);
        for (int r = 0; r < ROWS; r++) {
            c->act_ref(x + r * K, aref + r * arow, K);
            act->from_float(x + r * K, asimd + r * arow, K);
        }
        for (int i = 0; i < ROWS; i++) {
            for (int j = 0; j < ROWS; j++) {
                c->dot_ref(K, &dot_ref[i * ROWS + j], 0, wq + i * wrow, 0, aref + j * arow, 0, 1);
                cpu->vec_dot(K, &dot_simd[i * ROWS + j], 0, wq + i * wrow, 0, asimd + j * arow, 0, 1);
            }
        }
        write_file(dir, c->name, "x.f32", x, sizeof x);
        write_file(dir, c->name, "w.blocks", wq, ROWS * wrow);
        write_file(dir, c->name, "act_ref", aref, ROWS * arow);
        write_file(dir, c->name, "act_simd", asimd, ROWS * arow);
        write_file(dir, c->name, "dot_ref", dot_ref, sizeof dot_ref);
        write_file(dir, c->name, "dot_simd", dot_simd, sizeof dot_simd);
        printf("%s: %d weight rows x %d activation rows, k = %d\n", c->name, ROWS, ROWS, K);
        free(wq), free(aref), free(asimd);
    }
    return 0;
}

static int quantize(const char *type_name, long k, const char *in, const char *out) {
    enum ggml_type type = GGML_TYPE_COUNT;
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++)
        if (!strcmp(TYPES[t].name, type_name)) type = TYPES[t].type;
    if (type == GGML_TYPE_COUNT || k <= 0 || k % ggml_blck_size(type)) {
        fprintf(stderr, "ggml_oracle: bad type %s or k %ld\n", type_name, k);
        return 2;
    }
    FILE *f = fopen(in, "rb");
    if (!f) { perror(in); return 1; }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    long rows = bytes / 4 / k;
    if (rows * k * 4 != bytes) { fprintf(stderr, "ggml_oracle: %s is not rows of %ld f32\n", in, k); return 2; }
    float *x = malloc(bytes);
    if (fread(x, 1, bytes, f) != (size_t)bytes) { perror(in); return 1; }
    fclose(f);
    size_t n = ggml_row_size(type, k) * rows;
    void *q = malloc(n);
    ggml_quantize_chunk(type, x, q, 0, rows, k, NULL);
    f = fopen(out, "wb");
    if (!f || fwrite(q, 1, n, f) != n || fclose(f) != 0) { perror(out); return 1; }
    free(x), free(q);
    return 0;
}

int main(int argc, char **argv) {
    ggml_cpu_init();
    if (argc == 3 && !strcmp(argv[1], "vectors")) return vectors(argv[2]);
    if (argc == 6 && !strcmp(argv[1], "quantize")) return quantize(argv[2], atol(argv[3]), argv[4], argv[5]);
    fprintf(stderr, "usage: ggml_oracle vectors DIR | quantize TYPE K IN.f32 OUT.blocks\n");
    return 2;
}
