/* See dequant.h. Block layouts, little-endian, sizes in bytes:
 *   Q4_0 (32 weights, 18): fp16 d, 16 bytes of nibbles      w = (q - 8) d
 *   Q4_1 (32, 20):         fp16 d, fp16 m, 16 bytes         w = q d + m
 *   Q5_0 (32, 22):         fp16 d, 4 bytes of 5th bits, 16  w = (q - 16) d
 *   Q8_0 (32, 34):         fp16 d, 32 int8                  w = q d
 *   Q4_K (256, 144):       fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles;
 *                          8 sub-blocks of 32: w = d sc q - dmin m
 *   Q6_K (256, 210):       128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, fp16 d;
 *                          16 sub-blocks of 16: w = d sc (q - 32)
 * In the 32-weight blocks, byte j holds weight j in its low nibble and weight j + 16 in its high. */
#include "dequant.h"

#include <math.h>
#include <stddef.h>

static float half(const uint8_t *p) {
    unsigned h = (unsigned)p[0] | (unsigned)p[1] << 8;
    unsigned exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float v;
    if (exponent == 0)
        v = ldexpf((float)mantissa, -24);
    else if (exponent == 31)
        v = mantissa ? NAN : INFINITY;
    else
        v = ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
    return (h & 0x8000) ? -v : v;
}

static void q4_0(const uint8_t *b, float *y) {
    float d = half(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b[2 + j] & 0xf) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

static void q4_1(const uint8_t *b, float *y) {
    float d = half(b), m = half(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(b[4 + j] & 0xf) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}

static void q5_0(const uint8_t *b, float *y) {
    float d = half(b);
    uint32_t high = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    for (int j = 0; j < 16; j++) {
        int lo = (b[6 + j] & 0xf) | (int)((high >> j) & 1) << 4;
        int hi = (b[6 + j] >> 4) | (int)((high >> (j + 16)) & 1) << 4;
        y[j] = (float)(lo - 16) * d;
        y[j + 16] = (float)(hi - 16) * d;
    }
}

static void q8_0(const uint8_t *b, float *y) {
    float d = half(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Scale and min of Q4_K sub-block `j` (0..7) from the 12 packed bytes: sub-blocks 0..3 in the low
 * 6 bits of bytes j (scale) and j + 4 (min); 4..7 in the nibbles of bytes j + 4 with their top two
 * bits in the spare high bits of bytes j - 4 (scale) and j (min). */
static void q4_k_scale(const uint8_t *s, int j, int *scale, int *min) {
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4;
        *min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Pairs of sub-blocks share 32 bytes of nibbles: the low nibbles are the first, the high the second. */
static void q4_k(const uint8_t *b, float *y) {
    float d = half(b), dmin = half(b + 2);
    const uint8_t *q = b + 16;
    for (int pair = 0; pair < 4; pair++, q += 32, y += 64) {
        int sc, m;
        q4_k_scale(b + 4, 2 * pair, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        q4_k_scale(b + 4, 2 * pair + 1, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            y[l] = d1 * (float)(q[l] & 0xf) - m1;
            y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

/* Each half of 128 weights takes 64 low-nibble bytes, 32 high-bit bytes and 8 scales: weight l + 32 i
 * (i = 0..3) has the low (i even) or high (i odd) nibble of byte l + 32 (i & 1) and bits 2i..2i+1 of
 * high byte l, and scale l / 16 + 2i. */
static void q6_k(const uint8_t *b, float *y) {
    float d = half(b + 208);
    const uint8_t *low = b, *high = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    for (int half_block = 0; half_block < 2; half_block++, low += 64, high += 32, scales += 8, y += 128) {
        for (int l = 0; l < 32; l++) {
            for (int i = 0; i < 4; i++) {
                int nibble = (i & 2) ? low[l + 32 * (i & 1)] >> 4 : low[l + 32 * (i & 1)] & 0xf;
                int q = (nibble | ((high[l] >> (2 * i)) & 3) << 4) - 32;
                y[l + 32 * i] = d * (float)scales[l / 16 + 2 * i] * (float)q;
            }
        }
    }
}

int ref_dequantize_row(int type, const uint8_t *src, float *dst, int64_t k) {
    struct format { int type, weights, bytes; void (*block)(const uint8_t *, float *); };
    static const struct format FORMATS[] = {
        {2, 32, 18, q4_0}, {3, 32, 20, q4_1}, {6, 32, 22, q5_0},
        {8, 32, 34, q8_0}, {12, 256, 144, q4_k}, {14, 256, 210, q6_k},
    };
    for (size_t f = 0; f < sizeof FORMATS / sizeof FORMATS[0]; f++) {
        const struct format *fmt = &FORMATS[f];
        if (fmt->type != type) continue;
        if (k % fmt->weights != 0) return 0;
        for (int64_t i = 0; i < k / fmt->weights; i++) fmt->block(src + i * fmt->bytes, dst + i * fmt->weights);
        return 1;
    }
    return 0;
}
