//! x86-64 int8 GEMM kernels on the RK3588 tiling (A `[K/16][M][16]`, B `[N/32][K/32][32n][32k]`,
//! C `[N/4][M][4]`).
//!
//! Both kernels keep, per (row, channel) pair, a vector of partial sums across k (each lane a few
//! consecutive k), because B stores every channel's k contiguously; the lanes are summed once per
//! output, after the whole depth. A register block covers several rows × several channels so each
//! load feeds several multiplies.
//!
//! Exactness:
//! - AVX-512 VNNI: `vpdpbusd` multiplies unsigned by signed bytes and adds four products into an
//!   int32 lane without saturation. B is biased to `b + 128` (0..=255) while it is packed, so the
//!   sum is `Σ a·b + 128·Σ a`; the second term, one number per row, is subtracted. Everything is
//!   exact modulo 2^32, and the true result fits in int32.
//! - AVX2: `vpmaddubsw` saturates pairs of products to int16 (255·127·2 > 32767), so it is not
//!   used. Both operands are sign-extended to int16 and multiplied with `vpmaddwd`, which adds two
//!   products (each |p| ≤ 2^14) into an int32 lane: exact, at the same 32 products per cycle.

use super::Shape;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Bytes of one B k-block of one N-tile (32 channels × 32 k).
const B_BLOCK: usize = 32 * 32;

thread_local! {
    /// Per-thread scratch for repacked operands, kept between calls to avoid an allocation per GEMM.
    static A_PANELS: RefCell<Vec<i8>> = const { RefCell::new(Vec::new()) };
    static ROW_CORR: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    static B_GROUP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static A_WORDS: RefCell<Vec<i16>> = const { RefCell::new(Vec::new()) };
}

/// A `len`-element slice of `buf` starting on a 64-byte boundary: vector loads that straddle two
/// cache lines cost about a quarter of the kernel's speed.
fn aligned<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    buf.resize(len + 64 / size_of::<T>(), T::default());
    let start = buf.as_ptr().align_offset(64);
    &mut buf[start..start + len]
}

/// Offset in native B of channel `n`'s 32 k of k-block `kb`.
#[inline(always)]
fn b_offset(kp: usize, n: usize, kb: usize) -> usize {
    (n / 32) * 32 * kp + kb * B_BLOCK + (n % 32) * 32
}

// ---------------------------------------------------------------- AVX-512 VNNI

/// Rows per AVX-512 register block (× 8 channels): 16 accumulators, 4 B and 1 A register of 32.
const VNNI_ROWS: usize = 4;
/// Channels per AVX-512 register block.
const VNNI_GROUP: usize = 8;

/// Repacks A into panels of [`VNNI_ROWS`] rows: the panel of rows `r0..r0+R` at `r0·kp`, laid out
/// `[K/32][R][32]`, so a register block streams one contiguous run. Also returns, per row, the
/// bias correction `128·Σ a`.
fn pack_a_panels(m: usize, kp: usize, a: &[i8], out: &mut [i8], row_corr: &mut [i32]) {
    row_corr.fill(0);
    for r0 in (0..m).step_by(VNNI_ROWS) {
        let rows = (m - r0).min(VNNI_ROWS);
        for kb in 0..kp / 32 {
            for i in 0..rows {
                for half in 0..2 {
                    let src = &a[((kb * 2 + half) * m + r0 + i) * 16..][..16];
                    out[r0 * kp + (kb * rows + i) * 32 + half * 16..][..16].copy_from_slice(src);
                    row_corr[r0 + i] += 128 * src.iter().map(|&x| x as i32).sum::<i32>();
                }
            }
        }
    }
}

/// Copies the [`VNNI_GROUP`] channels from `n0` of native B into `[K/32][8][32]`, biased by +128.
/// In place their k-blocks lie 1 KiB apart, so a deep group falls into a quarter of the L1 sets
/// and evicts itself.
fn pack_b_group(kp: usize, b: &[i8], n0: usize, out: &mut [u8]) {
    for (kb, dst) in out.chunks_exact_mut(VNNI_GROUP * 32).enumerate() {
        let src = b_offset(kp, n0, kb);
        for (d, &x) in dst.iter_mut().zip(&b[src..src + VNNI_GROUP * 32]) {
            *d = (x as u8) ^ 0x80;
        }
    }
}

pub(super) fn gemm_vnni(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    let Shape { m, kp, np } = shape;
    A_PANELS.with_borrow_mut(|ap| {
        B_GROUP.with_borrow_mut(|bg| {
            ROW_CORR.with_borrow_mut(|corr| {
                let ap = aligned(ap, m * kp);
                let bg = aligned(bg, kp * VNNI_GROUP);
                let corr = aligned(corr, m);
                pack_a_panels(m, kp, a, ap, corr);
                for n0 in (0..np).step_by(VNNI_GROUP) {
                    pack_b_group(kp, b, n0, bg);
                    // SAFETY: the caller checked that this CPU has AVX-512 F/BW/VNNI
                    // (`Isa::Avx512`) and that `b` and `c` fit `shape`; `ap`, `bg` and `corr`
                    // were just packed for it.
                    unsafe { vnni_group(shape, ap, bg, corr, n0, b, c) }
                }
            })
        })
    });
}

/// Depth per pass, in 32-k blocks: a pass's B group (8 KiB per 1024 k) and A panel stay in L1.
const PASS_BLOCKS: usize = 64;

/// Channels `n0..n0+8` of C from the packed A panels and B group. While it runs, pulls the next
/// group of native `b` into L2, spread over the row blocks, so its packing does not wait for memory.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_group(
    shape: Shape,
    ap: &[i8],
    bg: &[u8],
    row_corr: &[i32],
    n0: usize,
    b: &[i8],
    c: &mut [i32],
) {
    let Shape { m, kp, np } = shape;
    let kbs = kp / 32;
    let next = n0 + VNNI_GROUP;
    // Lines of the next group: 4 per k-block.
    let next_lines = if next < np { kbs * 4 } else { 0 };
    let per_block = next_lines.div_ceil(m.div_ceil(VNNI_ROWS));
    let mut prefetched = 0;
    // Replicates row i's correction over its 4 channel slots.
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    // Deep products go in passes over the depth, each adding into C.
    for kb0 in (0..kbs).step_by(PASS_BLOCKS) {
        let blocks = PASS_BLOCKS.min(kbs - kb0);
        let bk = bg.as_ptr().add(kb0 * VNNI_GROUP * 32);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(VNNI_ROWS);
            for line in prefetched..(prefetched + per_block).min(next_lines) {
                let src = b
                    .as_ptr()
                    .add(b_offset(kp, next, line / 4) + (line % 4) * 64);
                _mm_prefetch::<_MM_HINT_T1>(src);
            }
            prefetched = (prefetched + per_block).min(next_lines);
            let panel = ap.as_ptr().add(r0 * kp + kb0 * rows * 32);
            let quads = match rows {
                1 => vnni_block::<1>(panel, bk, blocks),
                2 => vnni_block::<2>(panel, bk, blocks),
                3 => vnni_block::<3>(panel, bk, blocks),
                _ => vnni_block::<VNNI_ROWS>(panel, bk, blocks),
            };
            let mask: __mmask16 = ((1u32 << (4 * rows)) - 1) as __mmask16;
            let corr = _mm512_permutexvar_epi32(
                spread,
                _mm512_maskz_loadu_epi32(mask, row_corr.as_ptr().add(r0)),
            );
            for (q, &quad) in quads.iter().enumerate() {
                let out = c.as_mut_ptr().add(((n0 / 4 + q) * m + r0) * 4);
                let sum = if kb0 == 0 {
                    _mm512_sub_epi32(quad, corr)
                } else {
                    _mm512_add_epi32(quad, _mm512_maskz_loadu_epi32(mask, out))
                };
                _mm512_mask_storeu_epi32(out, mask, sum);
            }
            r0 += rows;
        }
    }
}

/// `R` (≤ 4) rows of A (a panel) × a packed biased B group (8 channels) over `kbs` k-blocks. Returns the two
/// channel quads, each as `[row 0: ch 0..4 | row 1 | row 2 | row 3]` (rows ≥ `R` are zero).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_block<const R: usize>(panel: *const i8, bp: *const u8, kbs: usize) -> [__m512i; 2] {
    let mut acc = [[_mm512_setzero_si512(); 4]; R];
    for kb in 0..kbs {
        let bk = bp.add(kb * VNNI_GROUP * 32);
        // Each load: 2 channels × 32 k; lanes 0..8 channel 2p, lanes 8..16 channel 2p+1.
        let bv: [__m512i; 4] = std::array::from_fn(|p| _mm512_loadu_si512(bk.add(p * 64).cast()));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let a32 = _mm256_loadu_si256(panel.add((kb * R + r) * 32).cast());
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
unsafe fn transpose_sum(s: [__m512i; 4]) -> __m512i {
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

/// Widens native A to int16 in the same `[K/16][M][16]` order.
fn pack_a_words(a: &[i8], out: &mut [i16]) {
    for (w, &x) in out.iter_mut().zip(a) {
        *w = x as i16;
    }
}

pub(super) fn gemm_avx2(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    A_WORDS.with_borrow_mut(|aw| {
        let aw = aligned(aw, shape.m * shape.kp);
        pack_a_words(a, aw);
        // SAFETY: the caller checked that this CPU has AVX2 (`Isa::Avx2`) and that `a`, `b` and
        // `c` fit `shape`; `aw` holds all of A.
        unsafe { avx2_all(shape, aw, b, c) }
    });
}

#[target_feature(enable = "avx2")]
unsafe fn avx2_all(shape: Shape, aw: &[i16], b: &[i8], c: &mut [i32]) {
    let Shape { m, kp, np } = shape;
    for quad in 0..np / 4 {
        let bp = b.as_ptr().add(b_offset(kp, quad * 4, 0));
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(AVX2_ROWS);
            let ar = aw.as_ptr().add(r0 * 16);
            let out = c.as_mut_ptr().add((quad * m + r0) * 4);
            match rows {
                1 => avx2_block::<1>(ar, m * 16, bp, kp / 16, out),
                _ => avx2_block::<AVX2_ROWS>(ar, m * 16, bp, kp / 16, out),
            }
            r0 += rows;
        }
    }
}

/// `R` rows of int16 A × 4 channels of B over `k16s` k-chunks of 16; stores the `R` × 4 results.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn avx2_block<const R: usize>(
    aw: *const i16,
    a_stride: usize,
    bp: *const i8,
    k16s: usize,
    out: *mut i32,
) {
    let mut acc = [[_mm256_setzero_si256(); 4]; R];
    for kk in 0..k16s {
        // Channel j's 16 k of chunk kk: k-block kk/2, half kk%2.
        let bk = bp.add((kk / 2) * B_BLOCK + (kk % 2) * 16);
        let bv: [__m256i; 4] =
            std::array::from_fn(|j| _mm256_cvtepi8_epi16(_mm_loadu_si128(bk.add(j * 32).cast())));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let av = _mm256_loadu_si256(aw.add(kk * a_stride + r * 16).cast());
            for j in 0..4 {
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
        _mm_storeu_si128(out.add(r * 4).cast(), sum);
    }
}
