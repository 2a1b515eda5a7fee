//! The CPU int8 GEMM on the NPU's native layouts: `C[M,N] (int32) = A[M,K] (int8) · B[K,N] (int8)`.
//!
//! [`reference`] defines "correct": a plain loop with exact int32 accumulation. The NPU backends
//! and every fast kernel must produce the same bits.
//!
//! Shapes are in native terms: `kp` and `np` are K and N already padded ([`Tiles::pad`]), `a` is
//! native A (`m` rows), `b` native B, `c` native C. Because whole N-tiles of B and the matching
//! columns of C are contiguous, a caller computes a range of output channels by passing the
//! sub-slices of `b` and `c` with a smaller `np`.

use crate::layout::Tiles;

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
