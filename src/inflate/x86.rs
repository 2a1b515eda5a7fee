//! x86-64 kernels: SSSE3 (16-byte `pshufb` tables), AVX2 (`avx2.rs`: a whole 32-byte run per
//! vector) and AVX-512 (`avx512.rs`: two tile rows per vector), and the scan's steps (the fp16
//! fields by loads or windows, Q4_K's scales unpacked by byte shuffles). They reproduce
//! [`super::scalar`] bit for bit: the same binary32 products in the same order, `cvtps2dq`
//! rounding to nearest-even as `round_ties_even` does (the default MXCSR mode, which Rust code
//! never changes), saturating packs where the scalar code's `as i8`/`clamp` saturate, and
//! `pmulhrsw`, which is exactly `(x·m + 2¹⁴) >> 15`.

use super::params::{fixed_codes, scaled_codes, table_fixed, TileParams};
use super::scalar::q4_k_pair_source;
use super::tile::{for_each_group, for_each_run, Tile};
use super::{ScanTile, TileKernel};
use crate::isa::Isa;
use crate::quant::GgmlType;
use std::arch::x86_64::*;

mod avx2;
mod avx512;
mod codebooks;
mod scan;
mod sets;

/// [`super::prefetch`]: every cache line of `bytes`, into all levels.
#[inline]
pub(super) fn prefetch(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint that never faults and changes nothing a program can observe;
        // SSE is part of every x86-64 CPU.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) }
    }
}

/// Calls a `#[target_feature]` kernel from the safe function pointer [`tile_kernel`] hands out.
macro_rules! unsafe_call {
    ($call:expr) => {
        // SAFETY: `tile_kernel` gives these out only for an `isa` the caller checked is
        // available, and each kernel enables exactly that path's features (and VBMI or GFNI,
        // which `tile_kernel` checks, for the kernels that use them).
        unsafe { $call }
    };
}

/// The kernel for `ty` on `isa`, if `isa` is an x86 path. Callers must have checked
/// `isa.is_available()`: the returned safe functions rely on it.
pub(super) fn tile_kernel(isa: Isa, ty: GgmlType, b_n: usize) -> Option<TileKernel> {
    let pairs = b_n.is_multiple_of(avx512::ROWS);
    // Byte permutes across a whole vector and GF(2) affine byte maps: the AVX-512 CPUs from
    // Ice Lake and Zen 4 on have both; on the others, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K take
    // the AVX2 kernels.
    let vbmi = std::arch::is_x86_feature_detected!("avx512vbmi");
    let gfni = std::arch::is_x86_feature_detected!("gfni");
    let k: TileKernel = match (isa, ty) {
        (Isa::Avx512, GgmlType::Q4_0) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q4_0(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q4_1) if pairs && vbmi => {
            |r, p, t, n| unsafe_call!(avx512::q4_1(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q5_0) if pairs && vbmi => {
            |r, p, t, n| unsafe_call!(avx512::q5_0(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q8_0) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q8_0(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q4_K) if pairs && vbmi => {
            |r, p, t, n| unsafe_call!(avx512::q4_k(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q6_K) if pairs && gfni => {
            |r, p, t, n| unsafe_call!(avx512::q6_k(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q5_1) if pairs && vbmi => {
            |r, p, t, n| unsafe_call!(avx512::q5_1(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q5_K) if pairs && vbmi => {
            |r, p, t, n| unsafe_call!(avx512::q5_k(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q2_K) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q2_k(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q3_K) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q3_k(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ4_NL) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::iq4_nl(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ4_XS) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::iq4_xs(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::MXFP4) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::mxfp4(r, p, t, n))
        }
        (Isa::Ssse3, GgmlType::Q4_0) => |r, p, t, n| unsafe_call!(ssse3::q4_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q4_1) => |r, p, t, n| unsafe_call!(ssse3::q4_1(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q5_0) => |r, p, t, n| unsafe_call!(ssse3::q5_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q8_0) => |r, p, t, n| unsafe_call!(ssse3::q8_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q4_K) => |r, p, t, n| unsafe_call!(ssse3::q4_k(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q6_K) => |r, p, t, n| unsafe_call!(ssse3::q6_k(r, p, t, n)),
        // AVX2, and AVX-512 tiles of an odd number of rows (or without the features above).
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q4_0) => {
            |r, p, t, n| unsafe_call!(avx2::q4_0(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q4_1) => {
            |r, p, t, n| unsafe_call!(avx2::q4_1(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q5_0) => {
            |r, p, t, n| unsafe_call!(avx2::q5_0(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q4_K) => {
            |r, p, t, n| unsafe_call!(avx2::q4_k(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q8_0) => {
            |r, p, t, n| unsafe_call!(avx2::q8_0(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q6_K) => {
            |r, p, t, n| unsafe_call!(avx2::q6_k(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q5_1) => {
            |r, p, t, n| unsafe_call!(avx2::q5_1(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q5_K) => {
            |r, p, t, n| unsafe_call!(avx2::q5_k(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q2_K) => {
            |r, p, t, n| unsafe_call!(avx2::q2_k(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q3_K) => {
            |r, p, t, n| unsafe_call!(avx2::q3_k(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ2_XXS) if pairs => {
            |r, p, t, n| unsafe_call!(codebooks::avx512_kernels::iq2_xxs(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ2_XS) if pairs => {
            |r, p, t, n| unsafe_call!(codebooks::avx512_kernels::iq2_xs(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ2_S) if pairs => {
            |r, p, t, n| unsafe_call!(codebooks::avx512_kernels::iq2_s(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ3_XXS) if pairs => {
            |r, p, t, n| unsafe_call!(codebooks::avx512_kernels::iq3_xxs(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ3_S) if pairs => {
            |r, p, t, n| unsafe_call!(codebooks::avx512_kernels::iq3_s(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ1_S) if pairs => {
            |r, p, t, n| unsafe_call!(codebooks::avx512_kernels::iq1_s(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::IQ1_M) if pairs => {
            |r, p, t, n| unsafe_call!(codebooks::avx512_kernels::iq1_m(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ2_XXS) => {
            |r, p, t, n| unsafe_call!(codebooks::avx2_kernels::iq2_xxs(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ2_XS) => {
            |r, p, t, n| unsafe_call!(codebooks::avx2_kernels::iq2_xs(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ2_S) => {
            |r, p, t, n| unsafe_call!(codebooks::avx2_kernels::iq2_s(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ3_XXS) => {
            |r, p, t, n| unsafe_call!(codebooks::avx2_kernels::iq3_xxs(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ3_S) => {
            |r, p, t, n| unsafe_call!(codebooks::avx2_kernels::iq3_s(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ1_S) => {
            |r, p, t, n| unsafe_call!(codebooks::avx2_kernels::iq1_s(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ1_M) => {
            |r, p, t, n| unsafe_call!(codebooks::avx2_kernels::iq1_m(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ4_NL) => {
            |r, p, t, n| unsafe_call!(avx2::iq4_nl(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::IQ4_XS) => {
            |r, p, t, n| unsafe_call!(avx2::iq4_xs(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::MXFP4) => {
            |r, p, t, n| unsafe_call!(avx2::mxfp4(r, p, t, n))
        }
        _ => return None,
    };
    Some(k)
}

/// The tile scan compiled for `isa`, if `isa` is an x86 path with a build of its own. It leaves
/// Q4_1/Q4_K/Q2_K's `[a_j, b_j]` unscaled and Q6_K/Q3_K's `e_j` unconverted
/// ([`TileParams::prepare_unscaled`]): every AVX2 and AVX-512 kernel of those types (the two
/// paths' only ones) multiplies them by the row's factor itself.
pub(super) fn scan_tile(isa: Isa) -> Option<ScanTile> {
    type Res = Result<(), (usize, usize)>;
    #[target_feature(enable = "avx2,f16c")]
    fn avx2(p: &mut TileParams, rows: &[&[u8]], scales: &mut [f32]) -> Res {
        p.prepare_unscaled(scan::OpsAvx2::new(), rows, scales)
    }
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
    fn avx512(p: &mut TileParams, rows: &[&[u8]], scales: &mut [f32]) -> Res {
        p.prepare_unscaled(scan::OpsAvx512::new(), rows, scales)
    }
    let s: ScanTile = match isa {
        Isa::Avx2 => |p, rows, s| unsafe_call!(avx2(p, rows, s)),
        Isa::Avx512 => |p, rows, s| unsafe_call!(avx512(p, rows, s)),
        _ => return None,
    };
    Some(s)
}

/// Where the four runs `r..r + 4` (`r` a multiple of 4: one 128-weight half) of a Q6_K row
/// live: the offsets of its 64 `ql` bytes and 32 `qh` bytes. Run `t` takes the low (t < 2) or
/// high nibbles of `ql[32·(t % 2)..][..32]` and bits `2t, 2t+1` of `qh`.
#[inline(always)]
fn q6_k_half_source(r: usize) -> (usize, usize) {
    let (block, half) = (r / 8, r % 8 / 4);
    (block * 210 + half * 64, block * 210 + 128 + half * 32)
}

/// A 16-byte load from the start of `src`.
#[inline(always)]
fn load16(src: &[u8]) -> __m128i {
    let src: &[u8; 16] = src[..16].try_into().expect("16 bytes");
    // SAFETY: `src` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(src.as_ptr().cast()) }
}

#[inline(always)]
fn store16(dst: &mut [i8], v: __m128i) {
    let dst: &mut [i8; 16] = (&mut dst[..16]).try_into().expect("16 bytes");
    // SAFETY: `dst` is 16 writable bytes; the store is unaligned.
    unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), v) }
}

/// `lut[q] = sat8((c[q]·m + 2¹⁴) >> 15)` for 16 scaled codes: the Q4_0/Q5_0 tables.
#[inline]
#[target_feature(enable = "ssse3")]
fn rescale_table(c: &[i16; 16], m: i16) -> __m128i {
    // SAFETY: `c` is 16 readable i16 (two unaligned 16-byte loads).
    let (c0, c1) = unsafe {
        (
            _mm_loadu_si128(c.as_ptr().cast()),
            _mm_loadu_si128(c[8..].as_ptr().cast()),
        )
    };
    let m = _mm_set1_epi16(m);
    _mm_packs_epi16(_mm_mulhrs_epi16(c0, m), _mm_mulhrs_epi16(c1, m))
}

mod ssse3 {
    use super::*;

    /// The codes `step·q` of [`table16`], eight per register.
    #[target_feature(enable = "ssse3")]
    fn table16_codes() -> [__m128i; 2] {
        let c: [i16; 16] = fixed_codes();
        // SAFETY: `c` is 32 readable bytes; unaligned loads.
        unsafe {
            [
                _mm_loadu_si128(c.as_ptr().cast()),
                _mm_loadu_si128(c[8..].as_ptr().cast()),
            ]
        }
    }

    /// The 16-entry table of a Q4_1 or Q4_K run, `table_entry` of [`table_fixed`]`(fg)` (`c`:
    /// [`table16_codes`]).
    #[target_feature(enable = "ssse3")]
    fn table16(c: &[__m128i; 2], fg: [f32; 2]) -> __m128i {
        let [f, g] = table_fixed::<16>(fg);
        let (f, g) = (_mm_set1_epi16(f), _mm_set1_epi16(g));
        // (x·512 + 2¹⁴) >> 15 = (x + 2⁵) >> 6.
        let round = _mm_set1_epi16(512);
        let step = |c: __m128i| _mm_mulhrs_epi16(_mm_adds_epi16(_mm_mulhrs_epi16(c, f), g), round);
        _mm_packs_epi16(step(c[0]), step(c[1]))
    }

    /// 16 quant bytes through a table, low nibbles first.
    #[target_feature(enable = "ssse3")]
    fn nibbles(qs: &[u8], lut: __m128i, out: &mut [i8; 32]) {
        let low = _mm_set1_epi8(15);
        let q = load16(qs);
        store16(&mut out[..16], _mm_shuffle_epi8(lut, _mm_and_si128(q, low)));
        store16(
            &mut out[16..],
            _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), low)),
        );
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c: [i16; 16] = scaled_codes(GgmlType::Q4_0);
        for_each_run(rows, params.m(), tile, runs, |row, &m, r, out| {
            nibbles(&row[r * 18 + 2..], rescale_table(&c, m), out);
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c = table16_codes();
        for_each_run(rows, params.fg(), tile, runs, |row, &fg, r, out| {
            nibbles(&row[r * 20 + 4..], table16(&c, fg), out);
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q5_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c: [i16; 32] = scaled_codes(GgmlType::Q5_0);
        let (c_lo, c_hi) = c.split_at(16);
        let (c_lo, c_hi): (&[i16; 16], &[i16; 16]) =
            (c_lo.try_into().expect("16"), c_hi.try_into().expect("16"));
        let low = _mm_set1_epi8(15);
        let bits = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        // Byte i of the result takes byte i / 8 of qh (first half) or 2 + i / 8 (second).
        let spread0 = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let spread1 = _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        for_each_run(rows, params.m(), tile, runs, |row, &m, r, out| {
            let blk = &row[r * 22..r * 22 + 22];
            let (t_lo, t_hi) = (rescale_table(c_lo, m), rescale_table(c_hi, m));
            let qh = _mm_set1_epi32(i32::from_le_bytes(blk[2..6].try_into().expect("4 bytes")));
            let q = load16(&blk[6..]);
            let pick = |idx: __m128i, spread: __m128i| {
                let hi = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(qh, spread), bits), bits);
                let (x, y) = (_mm_shuffle_epi8(t_lo, idx), _mm_shuffle_epi8(t_hi, idx));
                _mm_or_si128(_mm_andnot_si128(hi, x), _mm_and_si128(hi, y))
            };
            store16(&mut out[..16], pick(_mm_and_si128(q, low), spread0));
            store16(
                &mut out[16..],
                pick(_mm_and_si128(_mm_srli_epi16(q, 4), low), spread1),
            );
        });
    }

    /// `sat8((x·m + 2¹⁴) >> 15)` of 16 signed bytes times `2^(8 - SHIFT)`.
    #[target_feature(enable = "ssse3")]
    fn rescale16<const SHIFT: i32>(x: __m128i, m: i16) -> __m128i {
        let z = _mm_setzero_si128();
        // Widen to 16 bits as the high byte (x·256), then shift down arithmetically.
        let x0 = _mm_srai_epi16(_mm_unpacklo_epi8(z, x), SHIFT);
        let x1 = _mm_srai_epi16(_mm_unpackhi_epi8(z, x), SHIFT);
        let m = _mm_set1_epi16(m);
        _mm_packs_epi16(_mm_mulhrs_epi16(x0, m), _mm_mulhrs_epi16(x1, m))
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q8_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        for_each_run(rows, params.m(), tile, runs, |row, &m, r, out| {
            let blk = &row[r * 34..r * 34 + 34];
            for h in 0..2 {
                store16(
                    &mut out[16 * h..],
                    rescale16::<8>(load16(&blk[2 + 16 * h..]), m),
                );
            }
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c = table16_codes();
        let low = _mm_set1_epi8(15);
        for_each_group::<2, 1, _>(
            rows,
            params.fg(),
            tile,
            runs,
            |r, [row], [[p0, p1]], [[even], [odd]]| {
                let at = q4_k_pair_source(r);
                let (lo, hi) = (table16(&c, *p0), table16(&c, *p1));
                for h in 0..2 {
                    let q = load16(&row[at + 16 * h..]);
                    store16(
                        &mut even[16 * h..],
                        _mm_shuffle_epi8(lo, _mm_and_si128(q, low)),
                    );
                    store16(
                        &mut odd[16 * h..],
                        _mm_shuffle_epi8(hi, _mm_and_si128(_mm_srli_epi16(q, 4), low)),
                    );
                }
            },
        );
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q6_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let (low, bits45, bias) = (_mm_set1_epi8(15), _mm_set1_epi8(0x30), _mm_set1_epi8(32));
        for_each_group::<4, 1, _>(rows, params.m_pairs(), tile, runs, |r, [row], [m], out| {
            let (ql, qh) = q6_k_half_source(r);
            let out = out.map(|[o]| o);
            for h in 0..2 {
                let ql0 = load16(&row[ql + 16 * h..]);
                let ql1 = load16(&row[ql + 32 + 16 * h..]);
                let qh = load16(&row[qh + 16 * h..]);
                let and = |a, b| _mm_and_si128(a, b);
                let codes = [
                    _mm_or_si128(and(ql0, low), and(_mm_slli_epi16(qh, 4), bits45)),
                    _mm_or_si128(and(ql1, low), and(_mm_slli_epi16(qh, 2), bits45)),
                    _mm_or_si128(and(_mm_srli_epi16(ql0, 4), low), and(qh, bits45)),
                    _mm_or_si128(
                        and(_mm_srli_epi16(ql1, 4), low),
                        and(_mm_srli_epi16(qh, 2), bits45),
                    ),
                ];
                for (t, code) in codes.into_iter().enumerate() {
                    let y = rescale16::<6>(_mm_sub_epi8(code, bias), m[t][h]);
                    store16(&mut out[t][16 * h..], y);
                }
            }
        });
    }
}
