//! AVX2 (+F16C) column decoders, eight rows per 256-bit vector (one f32 lane per row): the
//! scalar reference's operations lane by lane. A row's byte of a column comes from eight loads
//! in plain blocks (rows `row_stride` apart), and in a repacked multi-block from the rows' pieces side by side: one load of
//! 32 (4-byte pieces) or 64 bytes (8-byte pieces: 64-bit shifts, then the low dwords), for
//! groups of four rows two loads. fp16 scales convert with `vcvtph2ps`, exact for every finite
//! half; a NaN comes out quiet, as every weight's product makes it anyway. The AVX-512 path runs
//! these too.

use super::super::params::q4k_scales_mins;
use super::scalar::{Decode, Q4K, Q4_0, Q4_1, Q5_0, Q6K, Q8_0};
use super::source::{Source, Window};
use super::{Column, Kernel, Loc, Plan, Run, LANES};
use crate::isa::Isa;
use crate::quant::{GgmlType, K_SCALE_SIZE};
use std::arch::x86_64::*;

/// Calls a `#[target_feature]` kernel from the safe function pointer [`kernel`] hands out.
macro_rules! unsafe_call {
    ($call:expr) => {
        // SAFETY: `kernel` gives these out only for an `isa` the caller checked is available
        // (AVX2 or AVX-512, both with AVX2 and F16C).
        unsafe { $call }
    };
}

/// The AVX2 decoder of `src`'s type and layout, if `isa` is an AVX2 path. Callers must have
/// checked `isa.is_available()`: the returned safe functions rely on it.
pub(super) fn kernel(isa: Isa, src: &Source) -> Option<Kernel> {
    if !matches!(isa, Isa::Avx2 | Isa::Avx512) {
        return None;
    }
    kernel_table!(src)
}

/// Lane `j`: the four bytes at offset `at` of row `r + j`'s block `x`, plain blocks (`at + 4`
/// inside the block).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn words(src: &Source, r: usize, x: usize, at: usize) -> __m256i {
    let first = r * src.row_step + x * src.block_step + at;
    let window = &src.data[first..first + (LANES - 1) * src.row_step + 4];
    // SAFETY: lane `j` reads the 4 bytes at `j·row_step` of `window`, all inside it.
    unsafe { words_at(window.as_ptr(), src.row_step) }
}

/// Lane `j`: the fp16 value at `loc` of row `r + j`'s block `x`, as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn halves<const R: usize>(src: &Source, r: usize, x: usize, loc: Loc) -> __m256 {
    let h = match R {
        1 => {
            let at = loc.at.min(src.ty.block_bytes() - 4);
            let v = words(src, r, x, at);
            let v = _mm256_and_si256(
                _mm256_srl_epi32(v, count(8 * (loc.at - at) as u32)),
                _mm256_set1_epi32(0xffff),
            );
            // Eight 16-bit values: lane-wise pack, then the two lanes' low halves.
            let v = _mm256_packus_epi32(v, v);
            _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b00_00_10_00>(v))
        }
        // The rows' halves side by side.
        8 => load16(&src.data[r / 8 * src.row_step + x * src.block_step + loc.at..]),
        4 => {
            let first = r / 4 * src.row_step + x * src.block_step + loc.at;
            let (a, b) = (
                load8(&src.data[first..]),
                load8(&src.data[first + src.row_step..]),
            );
            _mm_unpacklo_epi64(a, b)
        }
        _ => unreachable!("no layout has groups of {R} rows"),
    };
    _mm256_cvtph_ps(h)
}

/// A column's byte for the vectors of a strip ([`Window`]), and its shift as a count.
#[derive(Clone, Copy)]
struct Lanes<'a> {
    window: Window<'a>,
    count: __m128i,
}

impl<'a> Lanes<'a> {
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn new(window: Window<'a>) -> Lanes<'a> {
        Lanes {
            window,
            count: count(window.bits),
        }
    }

    /// Lane `j`: the byte of row `j` of vector `u`, in bits `0..8` after the shift (the bits
    /// above: the next bytes', or garbage).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn get<const R: usize, const C: usize>(&self, u: usize) -> __m256i {
        let w = &self.window;
        let at = w.vector(u);
        // SAFETY: the vector's `span` bytes from `Window::vector` lie in the window:
        // the plain rows' words at `j·row_step` (`j < 8`, 4 bytes each; `span = 7·row_step +
        // 4`), one load of 32 (8 rows of 4-byte pieces, `span = 32`) or the loads at 0 and
        // `second` (16 bytes each for 4-byte pieces in groups of four, 32 for 8-byte pieces:
        // `span = second + 16` or `second + 32`).
        unsafe {
            match (R, C) {
                (1, _) => _mm256_srl_epi32(words_at(at, w.row_step), self.count),
                (8, 4) => _mm256_srl_epi32(_mm256_loadu_si256(at.cast()), self.count),
                (4, 4) => _mm256_srl_epi32(
                    _mm256_loadu2_m128i(at.add(w.second).cast(), at.cast()),
                    self.count,
                ),
                _ => {
                    // Row `j`'s piece is qword `j`: shift each, then keep the low dwords.
                    let lo = _mm256_srl_epi64(_mm256_loadu_si256(at.cast()), self.count);
                    let hi = _mm256_loadu_si256(at.add(w.second).cast());
                    let hi = _mm256_srl_epi64(hi, self.count);
                    let low = _mm256_shuffle_ps::<0b10_00_10_00>(
                        _mm256_castsi256_ps(lo),
                        _mm256_castsi256_ps(hi),
                    );
                    // Rows 0 1 4 5 | 2 3 6 7 into order.
                    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_castps_si256(low))
                }
            }
        }
    }
}

/// Lane `j`: the 4 bytes at `at + j·step`. Eight loads and inserts: faster than `vpgatherdd`
/// on the machine measured (docs/PERFORMANCE.md, "Outlier columns").
///
/// # Safety
/// The 4 bytes at `at + j·step` for `j < 8` must be readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn words_at(at: *const u8, step: usize) -> __m256i {
    // SAFETY: the caller's promise.
    let w = |j: usize| unsafe { at.add(j * step).cast::<i32>().read_unaligned() };
    _mm256_setr_epi32(w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7))
}

/// A shift count for `_mm256_srl_*`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn count(bits: u32) -> __m128i {
    _mm_cvtsi32_si128(bits as i32)
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn load8(src: &[u8]) -> __m128i {
    let src: &[u8; 8] = src[..8].try_into().expect("8 bytes");
    // SAFETY: `src` is 8 readable bytes; unaligned load.
    unsafe { _mm_loadl_epi64(src.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn load16(src: &[u8]) -> __m128i {
    let src: &[u8; 16] = src[..16].try_into().expect("16 bytes");
    // SAFETY: `src` is 16 readable bytes; unaligned load.
    unsafe { _mm_loadu_si128(src.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn store8(dst: &mut [f32], v: __m256) {
    let dst: &mut [f32; 8] = (&mut dst[..8]).try_into().expect("8 floats");
    // SAFETY: `dst` is 8 writable floats; unaligned store.
    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) }
}

/// The low byte of each lane, sign-extended.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn signed8(v: __m256i) -> __m256i {
    _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(v))
}

/// `v & mask` as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn low(v: __m256i, mask: i32) -> __m256i {
    _mm256_and_si256(v, _mm256_set1_epi32(mask))
}

simd_drive!("avx2,f16c", __m256, _mm256_setzero_ps(), store8);

/// `c·a` lane by lane, `c` integer codes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn times(c: __m256i, a: __m256) -> __m256 {
    _mm256_mul_ps(_mm256_cvtepi32_ps(c), a)
}

#[target_feature(enable = "avx2,f16c")]
fn q4_0<const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    drive::<Q4_0, R, C, _, _>(
        src,
        plan,
        out,
        (),
        |_, _| (),
        |_, r, run, _| (halves::<R>(src, r, run.x, src.d), _mm256_setzero_ps()),
        |col, r0, x, units| {
            let flip = _mm256_set1_epi32(i32::from(col.flip >> col.shift[0]));
            (
                Lanes::new(src.window::<R, C>(r0, units, x, col.q[0], col.shift[0])),
                flip,
            )
        },
        |(q, flip), u, a, _| {
            let q = _mm256_xor_si256(q.get::<R, C>(u), *flip);
            times(_mm256_sub_epi32(low(q, 15), _mm256_set1_epi32(8)), a)
        },
    );
}

#[target_feature(enable = "avx2,f16c")]
fn q4_1(src: &Source, plan: &Plan, out: &mut [f32]) {
    drive::<Q4_1, 1, 0, _, _>(
        src,
        plan,
        out,
        (),
        |_, _| (),
        |_, r, run, _| {
            (
                halves::<1>(src, r, run.x, src.d),
                halves::<1>(src, r, run.x, src.m),
            )
        },
        |col, r0, x, units| Lanes::new(src.window::<1, 0>(r0, units, x, col.q[0], col.shift[0])),
        |q, u, a, b| _mm256_add_ps(times(low(q.get::<1, 0>(u), 15), a), b),
    );
}

/// Q5_0 in plain blocks: the rows' fifth bits, `qh`, are read once per block and ride in the
/// place of the `b` parameter Q5_0 has not.
#[target_feature(enable = "avx2,f16c")]
fn q5_0(src: &Source, plan: &Plan, out: &mut [f32]) {
    drive::<Q5_0, 1, 0, _, _>(
        src,
        plan,
        out,
        (),
        |_, _| (),
        |_, r, run, _| {
            let qh = words(src, r, run.x, 2);
            (halves::<1>(src, r, run.x, src.d), _mm256_castsi256_ps(qh))
        },
        |col, r0, x, units| {
            // Bit `e` of `qh`: byte `q[1].at - 2`, bit `shift[1]`.
            let bit = 8 * (col.q[1].at - 2) as u32 + col.shift[1];
            let lo = Lanes::new(src.window::<1, 0>(r0, units, x, col.q[0], col.shift[0]));
            (lo, count(bit))
        },
        |(lo, bit), u, a, qh| {
            let hi = low(_mm256_srl_epi32(_mm256_castps_si256(qh), *bit), 1);
            let q = _mm256_or_si256(low(lo.get::<1, 0>(u), 15), _mm256_slli_epi32::<4>(hi));
            times(_mm256_sub_epi32(q, _mm256_set1_epi32(16)), a)
        },
    );
}

#[target_feature(enable = "avx2,f16c")]
fn q8_0<const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    drive::<Q8_0, R, C, _, _>(
        src,
        plan,
        out,
        (),
        |_, _| (),
        |_, r, run, _| (halves::<R>(src, r, run.x, src.d), _mm256_setzero_ps()),
        |col, r0, x, units| Lanes::new(src.window::<R, C>(r0, units, x, col.q[0], 0)),
        |q, u, a, _| times(signed8(q.get::<R, C>(u)), a),
    );
}

/// Q4_K's block: `d`, `dmin` and (plain blocks) the scale packing's three words, per row.
#[derive(Clone, Copy)]
struct Q4KBlock {
    d: __m256,
    dmin: __m256,
    words: [__m256i; 3],
}

#[target_feature(enable = "avx2,f16c")]
fn q4_k<const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    let zero = Q4KBlock {
        d: _mm256_setzero_ps(),
        dmin: _mm256_setzero_ps(),
        words: [_mm256_setzero_si256(); 3],
    };
    drive::<Q4K, R, C, _, _>(
        src,
        plan,
        out,
        zero,
        |r, x| Q4KBlock {
            d: halves::<R>(src, r, x, src.d),
            dmin: halves::<R>(src, r, x, src.m),
            words: if R == 1 {
                [4, 8, 12].map(|at| words(src, r, x, at))
            } else {
                zero.words
            },
        },
        |blk, r, run, set| {
            let (sc, m) = if R == 1 {
                plain_q4k_scales(&blk.words, run.s)
            } else {
                let at = r / R * src.row_step + run.x * src.block_step + set.at;
                let packing = src.data[at..at + K_SCALE_SIZE]
                    .try_into()
                    .expect("12 bytes");
                let (sc, m) = q4k_scales_mins(packing);
                let widen =
                    |v: [u8; 8]| _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(v)));
                (widen(sc), widen(m))
            };
            (
                _mm256_mul_ps(blk.d, _mm256_cvtepi32_ps(sc)),
                _mm256_mul_ps(blk.dmin, _mm256_cvtepi32_ps(m)),
            )
        },
        |col, r0, x, units| Lanes::new(src.window::<R, C>(r0, units, x, col.q[0], col.shift[0])),
        |q, u, a, b| _mm256_sub_ps(times(low(q.get::<R, C>(u), 15), a), b),
    );
}

/// Sub-block `s`'s 6-bit scales and mins of eight rows from the words of their scale packings
/// (lane `j`: row `j`'s bytes `4i..4i + 4` in `words[i]`), as [`crate::quant::q4k_scale_min`]
/// unpacks them.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn plain_q4k_scales(words: &[__m256i; 3], s: usize) -> (__m256i, __m256i) {
    let n = count(8 * (s % 4) as u32);
    let [w0, w1, w2] = words.map(|w| _mm256_srl_epi32(w, n));
    if s < 4 {
        (low(w0, 63), low(w1, 63))
    } else {
        let top = |w: __m256i| _mm256_slli_epi32::<4>(low(_mm256_srli_epi32::<6>(w), 3));
        (
            _mm256_or_si256(low(w2, 15), top(w0)),
            _mm256_or_si256(low(_mm256_srli_epi32::<4>(w2), 15), top(w1)),
        )
    }
}

/// Q6_K's block: `d` and (plain blocks) the 16 scale bytes as four words, per row.
#[derive(Clone, Copy)]
struct Q6KBlock {
    d: __m256,
    words: [__m256i; 4],
}

#[target_feature(enable = "avx2,f16c")]
fn q6_k<const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    let zero = Q6KBlock {
        d: _mm256_setzero_ps(),
        words: [_mm256_setzero_si256(); 4],
    };
    drive::<Q6K, R, C, _, _>(
        src,
        plan,
        out,
        zero,
        |r, x| Q6KBlock {
            d: halves::<R>(src, r, x, src.d),
            words: if R == 1 {
                [192, 196, 200, 204].map(|at| words(src, r, x, at))
            } else {
                zero.words
            },
        },
        |blk, r, run, set| {
            let sc = if R == 1 {
                let w = blk.words[run.s / 4];
                signed8(_mm256_srl_epi32(w, count(8 * (run.s % 4) as u32)))
            } else {
                let at = r / R * src.row_step + run.x * src.block_step + set.at;
                _mm256_cvtepi8_epi32(load8(&src.data[at..]))
            };
            (
                _mm256_mul_ps(blk.d, _mm256_cvtepi32_ps(sc)),
                _mm256_setzero_ps(),
            )
        },
        |col, r0, x, units| {
            let at =
                |i: usize| Lanes::new(src.window::<R, C>(r0, units, x, col.q[i], col.shift[i]));
            (at(0), at(1))
        },
        |(lo, hi), u, a, _| {
            let (lo, hi) = (low(lo.get::<R, C>(u), 15), low(hi.get::<R, C>(u), 3));
            let q = _mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi));
            times(_mm256_sub_epi32(q, _mm256_set1_epi32(32)), a)
        },
    );
}
