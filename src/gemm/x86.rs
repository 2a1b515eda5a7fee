//! x86-64 int8 GEMM kernels on the RK3588 tiling (A `[K/16][M][16]`, B `[N/32][K/32][32n][32k]`,
//! C `[N/4][M][4]`).
//!
//! Both kernels keep, per (row, channel) pair, a vector of partial sums across k (each lane a few
//! consecutive k), because B stores every channel's k contiguously; the lanes are summed once per
//! output, after the whole depth. A register block covers several rows × several channels so each
//! load feeds several multiplies. Operands are first repacked into panels ([`super::pack`]).
//!
//! Exactness:
//! - AVX-512 VNNI: `vpdpbusd` multiplies unsigned by signed bytes and adds four products into an
//!   int32 lane without saturation. B is biased to `b + 128` (0..=255) while it is packed, so the
//!   sum is `Σ a·b + 128·Σ a`; the second term, one number per row, is subtracted. Everything is
//!   exact modulo 2^32, and the true result fits in int32.
//! - AVX2: `vpmaddubsw` saturates pairs of products to int16 (255·127·2 > 32767), so it is not
//!   used. Both operands are sign-extended to int16 (while packed) and multiplied with `vpmaddwd`,
//!   which adds two products (each |p| ≤ 2^14) into an int32 lane: exact, at the same 32 products
//!   per cycle.

use super::pack::{a_panels, aligned, b_group};
use super::Shape;
use std::arch::x86_64::*;
use std::cell::RefCell;

thread_local! {
    /// Per-thread scratch for repacked operands, kept between calls to avoid allocations per GEMM.
    static A_BYTES: RefCell<Vec<i8>> = const { RefCell::new(Vec::new()) };
    static B_BYTES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static ROW_CORR: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    static A_WORDS: RefCell<Vec<i16>> = const { RefCell::new(Vec::new()) };
    static B_WORDS: RefCell<Vec<i16>> = const { RefCell::new(Vec::new()) };
}

// ---------------------------------------------------------------- AVX-512 VNNI

/// Rows per AVX-512 register block (× 8 channels): 16 accumulators, 4 B and 1 A register of 32.
const VNNI_ROWS: usize = 4;
/// Channels per AVX-512 register block and packed B group.
const VNNI_GROUP: usize = 8;
/// Up to this many rows B is read in place rather than packed (measured faster up to M = 8 at the
/// A3B shapes; at M = 16 packing wins).
const NATIVE_B_ROWS: usize = 2 * VNNI_ROWS;
/// Cache lines of one group's k-block in native B (8 channels × 32 k, contiguous).
const GROUP_LINES: usize = VNNI_GROUP * 32 / 64;

/// `128·Σ_k a[r][k]` for every row: what the +128 bias on B adds to row `r`.
#[inline(always)]
fn bias_per_row(m: usize, kp: usize, a: &[i8], out: &mut [i32]) {
    out.fill(0);
    for chunk in a[..m * kp].chunks_exact(16 * m) {
        for (sum, row) in out.iter_mut().zip(chunk.chunks_exact(16)) {
            *sum += 128 * row.iter().map(|&x| x as i32).sum::<i32>();
        }
    }
}

pub(super) fn gemm_vnni(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    let Shape { m, kp, .. } = shape;
    A_BYTES.with_borrow_mut(|ap| {
        B_BYTES.with_borrow_mut(|bg| {
            ROW_CORR.with_borrow_mut(|corr| {
                let (ap, bg) = (aligned(ap, m * kp), aligned(bg, kp * VNNI_GROUP));
                // SAFETY: the caller checked that this CPU has AVX-512 F/BW/VNNI (`Isa::Avx512`)
                // and that `a`, `b` and `c` fit `shape`; the scratch slices are sized for it.
                unsafe { vnni_all(shape, a, b, c, ap, bg, aligned(corr, m)) }
            })
        })
    });
}

/// Packs and multiplies. The packers are inlined here so that they, too, use wide vectors.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI. `a`, `b` and `c` fit `shape` (what [`Shape::check`]
/// asserts: `kp` and `np` multiples of 32); `ap` holds `m·kp` bytes, `bg` `8·kp` and `corr` `m`
/// values.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_all(
    shape: Shape,
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    ap: &mut [i8],
    bg: &mut [u8],
    corr: &mut [i32],
) {
    let Shape { m, kp, np } = shape;
    a_panels(m, kp, a, VNNI_ROWS, 32, ap, |x| x);
    bias_per_row(m, kp, a, corr);
    // Channel `n0`'s first k-block in native B, for `n0 < np`.
    let native = |n0: usize| {
        // SAFETY: `b` holds `kp·np` bytes (the caller's promise) and channel `n0 < np` starts at
        // this offset inside them.
        unsafe { b.as_ptr().add((n0 / 32) * 32 * kp + (n0 % 32) * 32) }.cast::<u8>()
    };
    for n0 in (0..np).step_by(VNNI_GROUP) {
        if m <= NATIVE_B_ROWS {
            // Few row blocks read B few times: packing would mostly add a copy. (Prefetching
            // the next group here measured slower at K = 2048, M = 8, with B in L3.)
            // SAFETY: this function's features; `native(n0)` starts channels `n0..n0 + 8` of
            // native B, one N-tile (`np` is a multiple of 32), whose `kp / 32` k-blocks lie in
            // `b`; `ap`, `corr` and `c` fit `shape` (the caller's promise).
            unsafe { vnni_group::<true>(shape, ap, native(n0), None, corr, n0, c) };
        } else {
            // The packer reads each byte of B once per GEMM, mostly from DRAM (an expert the
            // cache kept): the next group is fetched while this one is multiplied.
            let next = (n0 + VNNI_GROUP < np).then(|| native(n0 + VNNI_GROUP));
            b_group(kp, b, n0, VNNI_GROUP, 32, bg, |x| (x as u8) ^ 0x80);
            // SAFETY: this function's features; `bg` holds the packed group (`kp / 32` blocks
            // of 8 × 32 bytes), `next` the next group's native B in `b`; `ap`, `corr` and `c`
            // fit `shape` (the caller's promise).
            unsafe { vnni_group::<false>(shape, ap, bg.as_ptr(), next, corr, n0, c) };
        }
    }
}

/// Channels `n0..n0+8` of C from the A panels and B at `bp`: native B (k-blocks 1 KiB apart,
/// biased on load) when `NATIVE`, else the packed group (already biased). The row blocks share
/// out the prefetch of the native group at `next`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI. `ap` holds the A panels of `m` rows (`m·kp` bytes),
/// `row_corr` `m` values and `c` native C of `m` rows for channels `n0..n0 + 8` at least. `bp`
/// points to `kp / 32` k-blocks of the group: 1 KiB apart in native B (`NATIVE`; 8 channels ×
/// 32 bytes read from each), else 256 bytes apart, packed. `next`, if any, points to `kp / 32`
/// such native k-blocks too (prefetched only).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_group<const NATIVE: bool>(
    shape: Shape,
    ap: &[i8],
    bp: *const u8,
    next: Option<*const u8>,
    row_corr: &[i32],
    n0: usize,
    c: &mut [i32],
) {
    let Shape { m, kp, .. } = shape;
    let kbs = kp / 32;
    // Replicates row i's correction over its 4 channel slots.
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let lines_per_block = GROUP_LINES.div_ceil(m.div_ceil(VNNI_ROWS));
    let mut r0 = 0;
    while r0 < m {
        let rows = (m - r0).min(VNNI_ROWS);
        // SAFETY: the panel of rows `r0..r0 + rows` starts at `r0·kp < m·kp` of `ap`.
        let panel = unsafe { ap.as_ptr().add(r0 * kp) };
        let first = r0 / VNNI_ROWS * lines_per_block;
        let fetch = match next {
            Some(p) if first < GROUP_LINES => Fetch {
                // SAFETY: line `first < GROUP_LINES` of the next group's first k-block.
                at: unsafe { p.add(first * 64) },
                lines: lines_per_block.min(GROUP_LINES - first),
            },
            _ => Fetch::NONE,
        };
        // SAFETY: this function's features; the panel holds `rows` rows of `kp` bytes in
        // 32-byte pieces, `bp` the group's `kbs` k-blocks (the caller's promise), and `fetch`
        // stays in the next group's k-blocks.
        let quads = unsafe {
            match rows {
                1 => vnni_block::<1, NATIVE>(panel, bp, kbs, fetch),
                2 => vnni_block::<2, NATIVE>(panel, bp, kbs, fetch),
                3 => vnni_block::<3, NATIVE>(panel, bp, kbs, fetch),
                _ => vnni_block::<VNNI_ROWS, NATIVE>(panel, bp, kbs, fetch),
            }
        };
        // One correction per row is read (never past `m`); the store covers 4 channels per row.
        let row_mask: __mmask16 = ((1u32 << rows) - 1) as __mmask16;
        let mask: __mmask16 = ((1u32 << (4 * rows)) - 1) as __mmask16;
        // SAFETY: the mask loads `row_corr[r0..r0 + rows]`, inside its `m` values.
        let corr = unsafe { _mm512_maskz_loadu_epi32(row_mask, row_corr.as_ptr().add(r0)) };
        let corr = _mm512_permutexvar_epi32(spread, corr);
        for (q, &quad) in quads.iter().enumerate() {
            // SAFETY: quad `q < 2` of channels `n0..n0 + 8`, rows `r0..r0 + rows`: the mask
            // stores `4·rows` values from `((n0/4 + q)·m + r0)·4`, inside native C of `m` rows.
            unsafe {
                let out = c.as_mut_ptr().add(((n0 / 4 + q) * m + r0) * 4);
                _mm512_mask_storeu_epi32(out, mask, _mm512_sub_epi32(quad, corr));
            }
        }
        r0 += rows;
    }
}

/// Lines of native B to prefetch in each k-block: `lines` cache lines from `at`, k-blocks 1 KiB
/// apart.
#[derive(Clone, Copy)]
struct Fetch {
    at: *const u8,
    lines: usize,
}

impl Fetch {
    const NONE: Fetch = Fetch {
        at: std::ptr::null(),
        lines: 0,
    };
}

/// `R` (≤ 4) rows of A (a panel) × 8 channels of B (native or packed, see [`vnni_group`]) over
/// `kbs` k-blocks, prefetching `fetch` on the way. Returns the two channel quads, each as `[row
/// 0: ch 0..4 | row 1 | row 2 | row 3]` (rows ≥ `R` are zero).
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI. `panel` points to `kbs·R·32` readable bytes; `bp` to
/// `kbs` k-blocks of 256 readable bytes, 1 KiB apart (`NATIVE`) or back to back; `fetch.at`, if
/// it has lines, to the first of `kbs` k-blocks 1 KiB apart of which it names lines (a hint:
/// never dereferenced).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_block<const R: usize, const NATIVE: bool>(
    panel: *const i8,
    bp: *const u8,
    kbs: usize,
    fetch: Fetch,
) -> [__m512i; 2] {
    let b_stride = if NATIVE { 32 * 32 } else { VNNI_GROUP * 32 };
    let bias = _mm512_set1_epi8(0x80u8 as i8);
    let mut acc = [[_mm512_setzero_si512(); 4]; R];
    for kb in 0..kbs {
        for l in 0..fetch.lines {
            // SAFETY: line `l` of k-block `kb` of the group `fetch` names (the caller's promise).
            _mm_prefetch::<_MM_HINT_T0>(unsafe { fetch.at.add(kb * 32 * 32 + l * 64) }.cast());
        }
        // SAFETY: k-block `kb < kbs` of the group.
        let bk = unsafe { bp.add(kb * b_stride) };
        // Each load: 2 channels × 32 k; lanes 0..8 channel 2p, lanes 8..16 channel 2p+1.
        let bv: [__m512i; 4] = std::array::from_fn(|p| {
            // SAFETY: bytes `64p..64p + 64` of the k-block's 256.
            let v = unsafe { _mm512_loadu_si512(bk.add(p * 64).cast()) };
            if NATIVE {
                _mm512_xor_si512(v, bias)
            } else {
                v
            }
        });
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: row `r < R`'s 32 bytes of k-block `kb` of the panel.
            let a32 = unsafe { _mm256_loadu_si256(panel.add((kb * R + r) * 32).cast()) };
            let av = _mm512_broadcast_i64x4(a32);
            for p in 0..4 {
                acc_r[p] = _mm512_dpbusd_epi32(acc_r[p], bv[p], av);
            }
        }
    }
    std::array::from_fn(|q| {
        // Per row: 128-bit block j = the 4 partial sums of channel j of the quad.
        let per_row: [__m512i; 4] = std::array::from_fn(|r| {
            if r < R {
                let (lo, hi) = (acc[r][2 * q], acc[r][2 * q + 1]);
                _mm512_add_epi32(
                    _mm512_shuffle_i32x4::<0b10_00_10_00>(lo, hi),
                    _mm512_shuffle_i32x4::<0b11_01_11_01>(lo, hi),
                )
            } else {
                _mm512_setzero_si512()
            }
        });
        transpose_sum(per_row)
    })
}

/// Given 4 rows whose 128-bit block j holds 4 partial sums of channel j, returns
/// `[row 0: ch 0..4 | row 1 | row 2 | row 3]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose_sum(s: [__m512i; 4]) -> __m512i {
    let t01 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(s[0], s[1]),
        _mm512_unpackhi_epi32(s[0], s[1]),
    );
    let t23 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(s[2], s[3]),
        _mm512_unpackhi_epi32(s[2], s[3]),
    );
    // Block j: [row 0, row 1, row 2, row 3] of channel j.
    let v = _mm512_add_epi32(
        _mm512_unpacklo_epi64(t01, t23),
        _mm512_unpackhi_epi64(t01, t23),
    );
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_epi32(idx, v)
}

// ---------------------------------------------------------------- AVX2

/// Rows per AVX2 register block (× 4 channels): 8 accumulators, 4 B and 2 A registers of 16.
const AVX2_ROWS: usize = 2;
/// Channels per AVX2 register block and packed B group.
const AVX2_GROUP: usize = 4;

pub(super) fn gemm_avx2(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    let Shape { m, kp, .. } = shape;
    A_WORDS.with_borrow_mut(|aw| {
        B_WORDS.with_borrow_mut(|bw| {
            // SAFETY: the caller checked that this CPU has AVX2 (`Isa::Avx2`) and that `a`, `b`
            // and `c` fit `shape`; the scratch slices are sized for it.
            unsafe {
                avx2_all(
                    shape,
                    a,
                    b,
                    c,
                    aligned(aw, m * kp),
                    aligned(bw, kp * AVX2_GROUP),
                )
            }
        })
    });
}

/// Packs and multiplies. The packers are inlined here so that they, too, use wide vectors.
///
/// # Safety
/// The CPU has AVX2. `a`, `b` and `c` fit `shape` (what [`Shape::check`] asserts: `kp` and `np`
/// multiples of 32); `aw` holds `m·kp` values and `bw` `4·kp`.
#[target_feature(enable = "avx2")]
unsafe fn avx2_all(
    shape: Shape,
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    aw: &mut [i16],
    bw: &mut [i16],
) {
    let Shape { m, kp, np } = shape;
    a_panels(m, kp, a, AVX2_ROWS, 16, aw, i16::from);
    for n0 in (0..np).step_by(AVX2_GROUP) {
        b_group(kp, b, n0, AVX2_GROUP, 16, bw, i16::from);
        // SAFETY: this function's features; `aw` holds the A panels and `bw` the packed group,
        // `c` fits `shape` (the caller's promise).
        unsafe { avx2_group(shape, aw, bw, n0, c) };
    }
}

/// Channels `n0..n0+4` of C from the int16 A panels and the packed int16 B group.
///
/// # Safety
/// The CPU has AVX2. `aw` holds the A panels of `m` rows (`m·kp` values), `bw` the packed group
/// (`4·kp` values) and `c` native C of `m` rows for channels `n0..n0 + 4` at least.
#[target_feature(enable = "avx2")]
unsafe fn avx2_group(shape: Shape, aw: &[i16], bw: &[i16], n0: usize, c: &mut [i32]) {
    let Shape { m, kp, .. } = shape;
    let mut r0 = 0;
    while r0 < m {
        let rows = (m - r0).min(AVX2_ROWS);
        // SAFETY: this function's features; the panel of rows `r0..r0 + rows` is `rows·kp`
        // values from `r0·kp` of `aw`, the group `kp / 16` chunks of 4 × 16 values of `bw`, and
        // rows `r0..r0 + rows` of channels `n0..n0 + 4` are `4·rows` values of `c` from
        // `(n0/4·m + r0)·4` (the caller's promise).
        unsafe {
            let panel = aw.as_ptr().add(r0 * kp);
            let out = c.as_mut_ptr().add((n0 / 4 * m + r0) * 4);
            match rows {
                1 => avx2_block::<1>(panel, bw.as_ptr(), kp / 16, out),
                _ => avx2_block::<AVX2_ROWS>(panel, bw.as_ptr(), kp / 16, out),
            }
        }
        r0 += rows;
    }
}

/// `R` rows of int16 A (a panel) × 4 channels of packed int16 B over `k16s` chunks of 16 k;
/// stores the `R` × 4 results.
///
/// # Safety
/// The CPU has AVX2. `panel` points to `k16s·R·16` readable values, `bw` to `k16s·4·16` and
/// `out` to `4·R` writable ones.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn avx2_block<const R: usize>(
    panel: *const i16,
    bw: *const i16,
    k16s: usize,
    out: *mut i32,
) {
    let mut acc = [[_mm256_setzero_si256(); AVX2_GROUP]; R];
    for kk in 0..k16s {
        // SAFETY: chunk `kk < k16s` of the group, 4 channels × 16 values.
        let bk = unsafe { bw.add(kk * AVX2_GROUP * 16) };
        let bv: [__m256i; AVX2_GROUP] = std::array::from_fn(|j| {
            // SAFETY: channel `j`'s 16 values of the chunk.
            unsafe { _mm256_loadu_si256(bk.add(j * 16).cast()) }
        });
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: row `r < R`'s 16 values of chunk `kk` of the panel.
            let av = unsafe { _mm256_loadu_si256(panel.add((kk * R + r) * 16).cast()) };
            for j in 0..AVX2_GROUP {
                acc_r[j] = _mm256_add_epi32(acc_r[j], _mm256_madd_epi16(av, bv[j]));
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let h = _mm256_hadd_epi32(
            _mm256_hadd_epi32(acc_r[0], acc_r[1]),
            _mm256_hadd_epi32(acc_r[2], acc_r[3]),
        );
        let sum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        // SAFETY: row `r < R`'s 4 values of `out`.
        unsafe { _mm_storeu_si128(out.add(r * 4).cast(), sum) };
    }
}
