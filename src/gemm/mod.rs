//! The CPU int8 GEMM on the NPU's native layouts: `C[M,N] (int32) = A[M,K] (int8) · B[K,N] (int8)`.
//!
//! [`reference`] defines "correct": a plain loop with exact int32 accumulation. The NPU backends
//! and every fast kernel must produce the same bits.
//!
//! Shapes are in native terms: `kp` and `np` are K and N already padded ([`Tiles::pad`]), `a` is
//! native A (`m` rows), `b` native B, `c` native C. Because whole N-tiles of B and the matching
//! columns of C are contiguous, a caller computes a range of output channels by passing the
//! sub-slices of `b` and `c` with a smaller `np`.
//!
//! The fast kernels ([`gemm_isa`] on one thread, [`gemm_parallel`] on the worker pool,
//! [`gemm_share`] for callers that bring their own threads) work on the RK3588 tiling and are
//! exact: int8 products summed in int32 with no saturating step, so they equal [`reference`] bit
//! for bit. How each stays exact is said where it is implemented.

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod pack;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::isa::Isa;
use crate::layout::Tiles;
use crate::pool::Pool;
use crate::sync::lock;
use std::ops::Range;
use std::sync::Mutex;

/// Shape of one native GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Rows of A and C.
    pub m: usize,
    /// Padded depth.
    pub kp: usize,
    /// Padded output channels covered by `b` and `c`.
    pub np: usize,
}

impl Shape {
    /// Panics unless the slices fit the shape: every caller owes the kernels this.
    pub fn check(&self, tiles: &Tiles, a: &[i8], b: &[i8], c: &[i32]) {
        assert!(
            self.kp.is_multiple_of(tiles.align) && self.np.is_multiple_of(tiles.align),
            "unpadded shape {self:?}"
        );
        assert!(
            a.len() >= tiles.a_len(self.m, self.kp),
            "A too short for {self:?}"
        );
        assert!(
            b.len() >= tiles.b_len(self.kp, self.np),
            "B too short for {self:?}"
        );
        assert!(
            c.len() >= tiles.c_len(self.m, self.np),
            "C too short for {self:?}"
        );
    }
}

/// The scalar reference GEMM.
pub fn reference(tiles: &Tiles, shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    shape.check(tiles, a, b, c);
    let Shape { m, kp, np } = shape;
    for n in 0..np {
        for r in 0..m {
            let mut acc = 0i32;
            for k in 0..kp {
                acc += a[tiles.a_index(m, r, k)] as i32 * b[tiles.b_index(kp, n, k)] as i32;
            }
            c[tiles.c_index(m, r, n)] = acc;
        }
    }
}

/// The fast GEMM on the best kernel path of this CPU ([`Isa::best`]), on the calling thread.
pub fn gemm(tiles: &Tiles, shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    gemm_isa(Isa::best(), tiles, shape, a, b, c);
}

/// The GEMM on an explicit kernel path, on the calling thread. Paths without an int8 kernel
/// (`Scalar`, `Ssse3`), and tilings other than [`Tiles::RK3588`], run [`reference`].
///
/// Panics if `isa` is not available on this CPU, or if the slices do not fit `shape`.
pub fn gemm_isa(isa: Isa, tiles: &Tiles, shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    shape.check(tiles, a, b, c);
    assert!(
        isa.is_available(),
        "kernel path {} is not available on this CPU",
        isa.name()
    );
    if shape.m == 0 || shape.np == 0 {
        return;
    }
    if *tiles != Tiles::RK3588 {
        return reference(tiles, shape, a, b, c);
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::gemm_vnni(shape, a, b, c),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::gemm_avx2(shape, a, b, c),
        #[cfg(target_arch = "aarch64")]
        Isa::NeonDot => neon::gemm_dot(shape, a, b, c),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::gemm_neon(shape, a, b, c),
        _ => reference(tiles, shape, a, b, c),
    }
}

/// The padded output channels share `ith` of `nth` computes: a balanced run of whole N-tiles
/// (empty when there are fewer tiles than shares).
pub fn share_columns(tiles: &Tiles, np: usize, ith: usize, nth: usize) -> Range<usize> {
    assert!(ith < nth, "share {ith} of {nth}");
    let n_tiles = np / tiles.b_n;
    (ith * n_tiles / nth) * tiles.b_n..((ith + 1) * n_tiles / nth) * tiles.b_n
}

/// Computes share `ith` of `nth` of the GEMM (the columns [`share_columns`] names), for callers
/// that run the shares on their own threads. `c_share` is that share's part of native C,
/// `c[cols.start * m..cols.end * m]`, so that every share owns a disjoint slice.
#[allow(clippy::too_many_arguments)]
pub fn gemm_share(
    isa: Isa,
    tiles: &Tiles,
    shape: Shape,
    a: &[i8],
    b: &[i8],
    c_share: &mut [i32],
    ith: usize,
    nth: usize,
) {
    let cols = share_columns(tiles, shape.np, ith, nth);
    let sub = Shape {
        np: cols.len(),
        ..shape
    };
    let b_share = &b[cols.start * shape.kp..cols.end * shape.kp];
    gemm_isa(isa, tiles, sub, a, b_share, c_share);
}

/// The GEMM split by N-tiles over `pool` (one share per pool thread, the caller included).
pub fn gemm_parallel(
    pool: &Pool,
    isa: Isa,
    tiles: &Tiles,
    shape: Shape,
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
) {
    shape.check(tiles, a, b, c);
    let nth = pool.threads().min(shape.np / tiles.b_n).max(1);
    // Hand every share its own disjoint part of C; the locks are never contended.
    let mut parts = Vec::with_capacity(nth);
    let mut rest = &mut c[..tiles.c_len(shape.m, shape.np)];
    for ith in 0..nth {
        let cols = share_columns(tiles, shape.np, ith, nth);
        let (part, tail) = rest.split_at_mut(cols.len() * shape.m);
        parts.push(Mutex::new(part));
        rest = tail;
    }
    pool.run(nth, |ith, nth| {
        let mut part = lock(&parts[ith]);
        gemm_share(isa, tiles, shape, a, b, &mut part, ith, nth);
    });
}
