/* The ggml patch declares its own copies of the few ABI types it uses (ggml needs no ork-moe
 * header). This file compiles those copies, extracted from the patch between its
 * "ork-moe ABI mirror" markers (the Makefile writes them to abi_mirror.inc with every ork_ name
 * prefixed mirror_), next to the real header and checks that they agree: sizes, field offsets
 * and the constants the patch relies on. Compiling it is the test. */
#include <stddef.h>
#include <stdint.h>

#include "ork_moe.h"
#include "abi_mirror.inc"

#define SAME_SIZE(t) _Static_assert(sizeof(mirror_##t) == sizeof(t), #t ": size differs from the header")
#define SAME_FIELD(t, mf, hf)                                                                              \
    _Static_assert(offsetof(mirror_##t, mf) == offsetof(t, hf), #t "." #hf ": offset differs from the header"); \
    _Static_assert(sizeof(((mirror_##t *)0)->mf) == sizeof(((t *)0)->hf), #t "." #hf ": size differs from the header")

SAME_SIZE(ork_tensor);
SAME_FIELD(ork_tensor, type, type);
SAME_FIELD(ork_tensor, ne, ne);
SAME_FIELD(ork_tensor, nb, nb);
SAME_FIELD(ork_tensor, data, data);
SAME_FIELD(ork_tensor, name, name);

SAME_SIZE(ork_threads);
SAME_FIELD(ork_threads, ith, ith);
SAME_FIELD(ork_threads, nth, nth);
SAME_FIELD(ork_threads, barrier, barrier);
SAME_FIELD(ork_threads, barrier_arg, barrier_arg);
SAME_FIELD(ork_threads, scratch, scratch);
SAME_FIELD(ork_threads, scratch_size, scratch_size);

/* The patch reads the counters as an array: n[0..3] and n[12] are the ones it prints. */
SAME_SIZE(ork_stats);
SAME_FIELD(ork_stats, n[0], calls);
SAME_FIELD(ork_stats, n[1], handled);
SAME_FIELD(ork_stats, n[2], declined);
SAME_FIELD(ork_stats, n[3], rows);
SAME_FIELD(ork_stats, n[12], cpu_gemms);
SAME_FIELD(ork_stats, modelled_npu_us, modelled_npu_us);
SAME_FIELD(ork_stats, backend, backend);

_Static_assert(sizeof(mirror_ork_log_callback) == sizeof(ork_log_callback), "ork_log_callback");
_Static_assert(mirror_ORK_LOG_ERROR_ == ORK_LOG_ERROR, "ORK_LOG_ERROR");
_Static_assert(mirror_ORK_LOG_WARN_ == ORK_LOG_WARN, "ORK_LOG_WARN");
_Static_assert(mirror_ORK_LOG_INFO_ == ORK_LOG_INFO, "ORK_LOG_INFO");
/* The patch builds the weights' layout codes (ORK_TYPE_*) from ggml's type and repack. */
_Static_assert(mirror_ORK_LAYOUT_ROWS_SHIFT_ == ORK_LAYOUT_ROWS_SHIFT, "ORK_LAYOUT_ROWS_SHIFT");
_Static_assert(mirror_ORK_LAYOUT_CHUNK_SHIFT_ == ORK_LAYOUT_CHUNK_SHIFT, "ORK_LAYOUT_CHUNK_SHIFT");
_Static_assert((2 | 8 << mirror_ORK_LAYOUT_ROWS_SHIFT_ | 8 << mirror_ORK_LAYOUT_CHUNK_SHIFT_) == ORK_TYPE_Q4_0_8X8, "q4_0_8x8");

int main(void) {
    /* The function types must match too: the patch's callback is assignable to the header's. */
    mirror_ork_log_callback mine = 0;
    ork_log_callback theirs = mine;
    (void)theirs;
    return 0;
}
