//! The scalar reference of the column decoders, one weight at a time, and the per-type decode
//! ([`Decode`]) the SIMD paths reproduce lane by lane.

use super::super::params::finite_half_to_f32;
use super::source::Source;
use super::{walk, Column, Kernel, Loc, Plan, Run, STRIP};
use crate::quant::fp16::f16_to_f32;
use crate::quant::grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::quant::{dequantize_element, e8m0_to_f32_half, iq4xs_scale, q3k_scales};
use crate::quant::{q4k_scale_min, K_SCALE_SIZE};
use std::ops::Range;

/// The reference decoder of `D` for `rows` rows per group of `chunk`-byte pieces.
pub(super) fn scalar_kernel<D: Decode>(rows: usize, chunk: usize) -> Kernel {
    match (rows, chunk) {
        (1, _) => scalar::<D, 1, 0>,
        (4, 4) => scalar::<D, 4, 4>,
        (4, 8) => scalar::<D, 4, 8>,
        (8, 4) => scalar::<D, 8, 4>,
        (8, 8) => scalar::<D, 8, 8>,
        other => unreachable!("no layout has {other:?} rows and bytes per piece"),
    }
}

fn scalar<D: Decode, const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    walk(src, plan, |rows, runs| {
        scalar_runs::<D, R, C>(src, plan, rows, runs, out)
    });
}

/// The reference: rows `rows` (at most a strip, whole groups) of one block's runs, one weight
/// at a time (`R` rows per group, their quant pieces `C` bytes; `R = 1`, `C = 0` plain). The
/// rows' fp16 fields are converted once for all runs; bytes are read a group at a time, one
/// bounds check per group.
#[inline(always)]
pub(super) fn scalar_runs<D: Decode, const R: usize, const C: usize>(
    src: &Source,
    plan: &Plan,
    rows: Range<usize>,
    runs: &[Run],
    out: &mut [f32],
) {
    let x = runs[0].x;
    // The group's bytes at `loc`, `lane` apart, from the row group starting at row `r`.
    let group = |r: usize, loc: Loc, lane: usize, len: usize| {
        let at = src.offset::<R>(r, x, loc);
        &src.data[at..at + (R - 1) * lane + len]
    };
    let (mut d, mut m) = ([0f32; STRIP], [0f32; STRIP]);
    for (r, (d, m)) in rows
        .clone()
        .step_by(R)
        .zip(d.chunks_exact_mut(R).zip(m.chunks_exact_mut(R)))
    {
        let halves = |loc: Loc, out: &mut [f32]| {
            // fp16 fields are 2-byte pieces.
            let h = group(r, loc, 2, 2);
            for (j, o) in out.iter_mut().enumerate() {
                *o = half(u16::from_le_bytes([h[2 * j], h[2 * j + 1]]));
            }
        };
        halves(src.d, d);
        if D::M {
            halves(src.m, m);
        }
    }
    let (mut a, mut b) = ([0f32; STRIP], [0f32; STRIP]);
    for run in runs {
        let set = D::set(src, run.s);
        for (i, r) in rows.clone().enumerate() {
            (a[i], b[i]) = D::params::<R>(src, r, x, run.s, set, d[i], m[i]);
        }
        for col in &plan.columns[run.range.clone()] {
            let dst = &mut out[col.slot * src.n + rows.start..][..rows.len()];
            for (g, (r, dst)) in rows
                .clone()
                .step_by(R)
                .zip(dst.chunks_exact_mut(R))
                .enumerate()
            {
                let q0 = group(r, col.q[0], C, 1);
                let q1 = group(r, col.q[if D::TWO_BYTES { 1 } else { 0 }], C, 1);
                for (j, o) in dst.iter_mut().enumerate() {
                    let i = g * R + j;
                    *o = D::weight([q0[j * C], q1[j * C]], col, a[i], b[i]);
                }
            }
        }
    }
}

/// The decoder of the codebook types (IQ2, IQ3, IQ1; plain blocks): each weight as
/// [`dequantize_element`] gives it, a strip of rows per column.
pub(super) fn by_element(src: &Source, plan: &Plan, out: &mut [f32]) {
    let bytes = src.ty.block_bytes();
    walk(src, plan, |rows, runs| {
        let x = runs[0].x;
        for col in runs.iter().flat_map(|run| &plan.columns[run.range.clone()]) {
            let dst = &mut out[col.slot * src.n + rows.start..][..rows.len()];
            for (r, o) in rows.clone().zip(dst) {
                let at = src.offset::<1>(r, x, Loc::default());
                *o = dequantize_element(src.ty, &src.data[at..at + bytes], col.element);
            }
        }
    });
}

/// binary16 → binary32, exact for every half: branch-free for the finite scales real weights
/// have.
#[inline(always)]
pub(super) fn half(h: u16) -> f32 {
    if h & 0x7c00 == 0x7c00 {
        f16_to_f32(h)
    } else {
        finite_half_to_f32(h)
    }
}

/// One type's decode: the parameters of a row's parameter set and a weight from them.
pub(super) trait Decode {
    /// Whether a code takes a second byte (`Column::q[1]`).
    const TWO_BYTES: bool = false;
    /// Whether the block has a second fp16 field (`Source::m`).
    const M: bool = false;

    /// Where parameter set `s`'s own bytes lie (Q4_K's scale packing, Q6_K's scale), if any.
    fn set(_src: &Source, _s: usize) -> Loc {
        Loc::default()
    }

    /// `(a, b)` of row `r`, block `x`, parameter set `s` (its bytes at `set`), from the block's
    /// fp16 fields `d` and `m` (0 if none); by default the block's scale alone.
    #[inline(always)]
    fn params<const R: usize>(
        _src: &Source,
        _r: usize,
        _x: usize,
        _s: usize,
        _set: Loc,
        d: f32,
        _m: f32,
    ) -> (f32, f32) {
        (d, 0.0)
    }

    /// The weight of column `col` from its code's bytes `q` (as stored) and its row's
    /// parameters.
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32;
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q8_0;
pub(super) struct Q4K;
pub(super) struct Q6K;
pub(super) struct Q5_1;
pub(super) struct Q5K;
pub(super) struct Q2K;
pub(super) struct Q3K;
pub(super) struct Iq4Nl;
pub(super) struct Iq4Xs;
pub(super) struct Mxfp4;

impl Decode for Q4_0 {
    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        let c = (((q[0] ^ col.flip) >> col.shift[0]) & 15) as i32 - 8;
        c as f32 * a
    }
}

impl Decode for Q4_1 {
    const M: bool = true;

    #[inline(always)]
    fn params<const R: usize>(
        _: &Source,
        _: usize,
        _: usize,
        _: usize,
        _: Loc,
        d: f32,
        m: f32,
    ) -> (f32, f32) {
        (d, m)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32 {
        let c = (q[0] >> col.shift[0]) & 15;
        c as f32 * a + b
    }
}

impl Decode for Q5_0 {
    const TWO_BYTES: bool = true;

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        let (lo, hi) = ((q[0] >> col.shift[0]) & 15, (q[1] >> col.shift[1]) & 1);
        let c = (lo | hi << 4) as i32 - 16;
        c as f32 * a
    }
}

impl Decode for Q8_0 {
    #[inline(always)]
    fn weight(q: [u8; 2], _: &Column, a: f32, _: f32) -> f32 {
        q[0] as i8 as f32 * a
    }
}

impl Decode for Q4K {
    const M: bool = true;

    fn set(src: &Source, s: usize) -> Loc {
        src.q4k_scales(s)
    }

    /// Plain blocks: sub-block `s` of the row's scale packing; repacked: the group's packing of
    /// sub-block `s` holds the rows' pairs in the sub-blocks' places.
    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        s: usize,
        set: Loc,
        d: f32,
        dmin: f32,
    ) -> (f32, f32) {
        let at = src.offset::<R>(r, x, set);
        let packing: &[u8; K_SCALE_SIZE] = src.data[at..at + K_SCALE_SIZE]
            .try_into()
            .expect("12 bytes");
        let (sc, m) = q4k_scale_min(if R == 1 { s } else { r % R }, packing);
        (d * sc as f32, dmin * m as f32)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32 {
        let c = (q[0] >> col.shift[0]) & 15;
        c as f32 * a - b
    }
}

impl Decode for Q6K {
    const TWO_BYTES: bool = true;

    fn set(src: &Source, s: usize) -> Loc {
        src.loc(192 + s)
    }

    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        _: usize,
        set: Loc,
        d: f32,
        _: f32,
    ) -> (f32, f32) {
        (d * src.byte::<R>(r, x, set) as i8 as f32, 0.0)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        let (lo, hi) = ((q[0] >> col.shift[0]) & 15, (q[1] >> col.shift[1]) & 3);
        let c = (lo | hi << 4) as i32 - 32;
        c as f32 * a
    }
}

impl Decode for Q5_1 {
    const TWO_BYTES: bool = true;
    const M: bool = true;

    #[inline(always)]
    fn params<const R: usize>(
        _: &Source,
        _: usize,
        _: usize,
        _: usize,
        _: Loc,
        d: f32,
        m: f32,
    ) -> (f32, f32) {
        (d, m)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32 {
        let (lo, hi) = ((q[0] >> col.shift[0]) & 15, (q[1] >> col.shift[1]) & 1);
        (lo | hi << 4) as f32 * a + b
    }
}

impl Decode for Q5K {
    const TWO_BYTES: bool = true;
    const M: bool = true;

    fn set(src: &Source, s: usize) -> Loc {
        src.q4k_scales(s)
    }

    /// Q4_K's sub-block parameters (the same header).
    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        s: usize,
        set: Loc,
        d: f32,
        dmin: f32,
    ) -> (f32, f32) {
        Q4K::params::<R>(src, r, x, s, set, d, dmin)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32 {
        let (lo, hi) = ((q[0] >> col.shift[0]) & 15, (q[1] >> col.shift[1]) & 1);
        (lo | hi << 4) as f32 * a - b
    }
}

impl Decode for Q2K {
    const M: bool = true;

    fn set(src: &Source, s: usize) -> Loc {
        src.loc(s)
    }

    /// Set `s`'s scale byte: `(fl(d·(sc & 15)), fl(dmin·(sc >> 4)))`.
    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        _: usize,
        set: Loc,
        d: f32,
        dmin: f32,
    ) -> (f32, f32) {
        let sc = src.byte::<R>(r, x, set);
        (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32 {
        ((q[0] >> col.shift[0]) & 3) as f32 * a - b
    }
}

impl Decode for Q3K {
    const TWO_BYTES: bool = true;

    fn set(src: &Source, _: usize) -> Loc {
        src.loc(96)
    }

    /// Set `s`'s six-bit scale from the 12 packed bytes: `fl(d·(sc - 32))`.
    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        s: usize,
        set: Loc,
        d: f32,
        _: f32,
    ) -> (f32, f32) {
        let at = src.offset::<R>(r, x, set);
        let packed: &[u8; 12] = src.data[at..at + 12].try_into().expect("12 bytes");
        (d * q3k_scales(packed)[s] as f32, 0.0)
    }

    /// The 2-bit code less 4 where its `hmask` bit is clear.
    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        let low = ((q[0] >> col.shift[0]) & 3) as i32;
        let c = low
            - if (q[1] >> col.shift[1]) & 1 != 0 {
                0
            } else {
                4
            };
        a * c as f32
    }
}

impl Decode for Iq4Nl {
    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        a * KVALUES_IQ4NL[((q[0] >> col.shift[0]) & 15) as usize] as f32
    }
}

impl Decode for Iq4Xs {
    fn set(src: &Source, _: usize) -> Loc {
        src.loc(2)
    }

    /// Sub-block `s`'s six-bit scale from `scales_h` and `scales_l`: `fl(d·(ls - 32))`.
    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        s: usize,
        set: Loc,
        d: f32,
        _: f32,
    ) -> (f32, f32) {
        let at = src.offset::<R>(r, x, set);
        let b = &src.data[at..at + 6];
        let ls = iq4xs_scale(s, [b[0], b[1]], b[2..6].try_into().expect("4 bytes"));
        (d * (ls - 32) as f32, 0.0)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        a * KVALUES_IQ4NL[((q[0] >> col.shift[0]) & 15) as usize] as f32
    }
}

impl Decode for Mxfp4 {
    fn set(src: &Source, _: usize) -> Loc {
        src.loc(0)
    }

    /// The block's E8M0 scale (its first byte, at `set`; the fp16 `d` read for every type is
    /// unused).
    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        _: usize,
        set: Loc,
        _: f32,
        _: f32,
    ) -> (f32, f32) {
        (e8m0_to_f32_half(src.byte::<R>(r, x, set)), 0.0)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        KVALUES_MXFP4[((q[0] >> col.shift[0]) & 15) as usize] as f32 * a
    }
}
