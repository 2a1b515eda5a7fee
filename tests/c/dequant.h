/* Reference dequantization of ggml's block formats for the harness's f64 reference, written from
 * the blocks' layout (ggml-common.h) and independent of the library's own. */
#ifndef ORK_TEST_DEQUANT_H
#define ORK_TEST_DEQUANT_H

#include <stdint.h>

/* Dequantizes `k` weights (whole blocks) of ggml type `type` (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)
 * from `src` into `dst`. Returns 0 for another type or a `k` that is no whole number of blocks. */
int ref_dequantize_row(int type, const uint8_t *src, float *dst, int64_t k);

#endif
