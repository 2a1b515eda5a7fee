//! The scatter's inner loop: one `dst` row from the native C quads of one GEMM row, scaled.
//!
//! `dst[4t + j] = (C[t][j] as f32 · (row_scale · chan[t][j])) · post + add[4t + j]`, the one
//! expression every path evaluates in this order (so equal int32 results give equal f32 bits on
//! every backend and path); `post` (a tiny row's power of two) is skipped when it is 1 and `add`
//! (the outlier correction) when there is none, so ordinary rows get `C · (row_scale · chan)`.
//!
//! The x86-64 path converts and scales a whole quad per instruction (SSE2, part of x86-64) and
//! writes with streaming stores when the row is 16-byte aligned: `dst` (3.1 M floats at 512
//! tokens of the A3B gate case) is written once and not read back by this call, so fetching its
//! lines into the cache first (what ordinary stores do) only costs memory traffic. A store fence
//! ([`publish`]) ends each work item's rows, so they are visible to other threads like ordinary
//! stores before the call's barrier. Other targets run the scalar path (relaxed atomic stores, plain stores there).

use crate::isa::Isa;
use std::sync::atomic::{AtomicU32, Ordering};

/// Channels per native C quad (the RK3588's `c_n`).
pub const QUAD: usize = 4;

/// How one row's int32 results become f32 (module docs).
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    pub scale: f32,
    /// Applied last, before `add`: a tiny row's power of two (`RowScale::exp2`), else 1.
    pub post: f32,
    /// Added per channel (`dst.len()` long): the row's outlier correction.
    pub add: Option<&'a [f32]>,
}

impl Row<'_> {
    /// The reference expression for int32 `c` in channel `n` of scale `chan`.
    #[inline]
    fn value(&self, c: i32, chan: f32, n: usize) -> f32 {
        let v = c as f32 * (self.scale * chan);
        let v = if self.post == 1.0 { v } else { v * self.post };
        match self.add {
            Some(add) => v + add[n],
            None => v,
        }
    }
}

/// Writes `dst[4t + j]` (module docs) from `quads[first + t·stride][j]` for every
/// `4t + j < dst.len()`. `chan` must hold `dst.len().div_ceil(4)` quads and `quads` the
/// strided ones (panics otherwise, like slice indexing). Call [`publish`] after the last row,
/// before anything lets other threads read `dst`.
pub fn scale_row(
    isa: Isa,
    quads: &[[i32; QUAD]],
    first: usize,
    stride: usize,
    row: Row,
    chan: &[[f32; QUAD]],
    dst: &[AtomicU32],
) {
    if let Some(add) = row.add {
        assert!(add.len() >= dst.len(), "one addend per channel");
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        return x86::scale_row(quads, first, stride, row, chan, dst);
    }
    let _ = isa;
    scale_row_scalar(quads, first, stride, row, chan, dst);
}

/// Orders the rows written by [`scale_row`] on this thread before any later store (the barrier
/// that publishes them): streaming stores are weakly ordered. One fence per run of rows, not per
/// row, so the rows' write-backs overlap.
pub fn publish(isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: SSE is part of the x86-64 baseline.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    let _ = isa;
}

/// The reference path.
fn scale_row_scalar(
    quads: &[[i32; QUAD]],
    first: usize,
    stride: usize,
    row: Row,
    chan: &[[f32; QUAD]],
    dst: &[AtomicU32],
) {
    for (t, out) in dst.chunks(QUAD).enumerate() {
        let (q, s) = (&quads[first + t * stride], &chan[t]);
        for (j, d) in out.iter().enumerate() {
            let v = row.value(q[j], s[j], QUAD * t + j);
            d.store(v.to_bits(), Ordering::Relaxed);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Row, QUAD};
    use std::arch::x86_64::*;
    use std::sync::atomic::AtomicU32;

    pub(super) fn scale_row(
        quads: &[[i32; QUAD]],
        first: usize,
        stride: usize,
        row: Row,
        chan: &[[f32; QUAD]],
        dst: &[AtomicU32],
    ) {
        let whole = dst.len() / QUAD;
        // `AtomicU32` has the layout of `u32` and lives in an `UnsafeCell`: writing through this
        // pointer is allowed while no other thread accesses these elements (each `dst` element
        // belongs to one work item of one thread).
        let out = dst.as_ptr() as *mut f32;
        let aligned = (out as usize).is_multiple_of(16);
        let quads = &quads[first..];
        let (post, add) = (row.post != 1.0, row.add.map(|a| &a[..whole * QUAD]));
        // SAFETY: SSE2 is part of the x86-64 baseline. Every load reads one whole `[_; 4]` that
        // slice indexing bounds-checked, or four addends of `add` (`whole · 4` long); every
        // store writes elements `4t..4t + 4` with `4t + 4 <= whole · 4 <= dst.len()`, and
        // `_mm_stream_ps` only when `out` (hence `out + 4t`) is 16-byte aligned.
        unsafe {
            let (rs, pv) = (_mm_set1_ps(row.scale), _mm_set1_ps(row.post));
            for t in 0..whole {
                let q = _mm_loadu_si128(quads[t * stride].as_ptr() as *const __m128i);
                let s = _mm_mul_ps(rs, _mm_loadu_ps(chan[t].as_ptr()));
                let mut y = _mm_mul_ps(_mm_cvtepi32_ps(q), s);
                if post {
                    y = _mm_mul_ps(y, pv);
                }
                if let Some(add) = add {
                    y = _mm_add_ps(y, _mm_loadu_ps(add[QUAD * t..QUAD * t + QUAD].as_ptr()));
                }
                if aligned {
                    _mm_stream_ps(out.add(QUAD * t), y);
                } else {
                    _mm_storeu_ps(out.add(QUAD * t), y);
                }
            }
        }
        if whole * QUAD < dst.len() {
            let tail = Row {
                add: row.add.map(|a| &a[whole * QUAD..]),
                ..row
            };
            super::scale_row_scalar(
                &quads[whole * stride..],
                0,
                stride,
                tail,
                &chan[whole..],
                &dst[whole * QUAD..],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn every_path_equals_scalar_bit_for_bit() {
        let mut rng = Rng::new(0x5ca7_7e12);
        let adversarial_c = [
            0,
            1,
            -1,
            i32::MAX,
            i32::MIN,
            16_777_217,
            -16_777_217,
            123_456_789,
        ];
        let adversarial_scale = [
            0.0f32,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::MIN_POSITIVE / 4.0,
            1e30,
            -3.5,
        ];
        for case in 0..200 {
            let (m, width) = (1 + rng.below(9), 1 + rng.below(70));
            let first = rng.below(m);
            let nq = width.div_ceil(4);
            let quads: Vec<[i32; 4]> = (0..nq * m)
                .map(|_| {
                    std::array::from_fn(|_| {
                        if rng.below(4) == 0 {
                            adversarial_c[rng.below(adversarial_c.len())]
                        } else {
                            rng.next_u32() as i32 >> rng.below(31)
                        }
                    })
                })
                .collect();
            let chan: Vec<[f32; 4]> = (0..nq)
                .map(|_| {
                    std::array::from_fn(|_| {
                        if rng.below(8) == 0 {
                            adversarial_scale[rng.below(adversarial_scale.len())]
                        } else {
                            rng.uniform(-2.0, 2.0) * 1e-3
                        }
                    })
                })
                .collect();
            let rs = if case % 7 == 0 {
                adversarial_scale[case % adversarial_scale.len()]
            } else {
                rng.uniform(0.0, 0.05)
            };
            // Offsets 0..3 put the row on and off a 16-byte boundary.
            let at = rng.below(4);
            // A tiny row's power of two, and an outlier correction, on some rows.
            let post = if case % 5 == 1 { 2f32.powi(-100) } else { 1.0 };
            let add: Vec<f32> = (0..width).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let row = Row {
                scale: rs,
                post,
                add: (case % 3 == 1).then_some(&add[..]),
            };
            let run = |isa| {
                let dst: Vec<AtomicU32> = (0..at + width + 3)
                    .map(|_| AtomicU32::new(0xdead_beef))
                    .collect();
                scale_row(isa, &quads, first, m, row, &chan, &dst[at..at + width]);
                publish(isa);
                dst.iter()
                    .map(|d| d.load(Ordering::Relaxed))
                    .collect::<Vec<u32>>()
            };
            let want = run(Isa::Scalar);
            assert!(want[..at]
                .iter()
                .chain(&want[at + width..])
                .all(|&x| x == 0xdead_beef));
            for (i, &got) in want[at..at + width].iter().enumerate() {
                let (t, j) = (i / 4, i % 4);
                let mut y = quads[first + t * m][j] as f32 * (rs * chan[t][j]);
                if post != 1.0 {
                    y *= post;
                }
                if let Some(add) = row.add {
                    y += add[i];
                }
                assert_eq!(got, y.to_bits(), "scalar, case {case} element {i}");
            }
            for isa in Isa::available() {
                let got = run(isa);
                assert_eq!(got, want, "{isa:?} case {case} m {m} width {width} at {at}");
            }
        }
    }
}
