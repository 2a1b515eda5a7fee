//! What a submit is: the GEMMs a caller describes, the validated submit the backends receive, and
//! the report of a finished one.

use super::buffer::Buffer;
use super::kinds::{CoreMask, Primitive};
use crate::layout::Tiles;

/// One GEMM of a submit. `k` and `n` are padded; offsets are in elements of each buffer.
/// The int32 result goes to the submit's C buffer at `c_offset` (`m·n` elements).
pub struct MatMul<'a> {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a: &'a Buffer<i8>,
    pub a_offset: usize,
    pub b: &'a Buffer<i8>,
    pub b_offset: usize,
    pub c_offset: usize,
}

impl MatMul<'_> {
    /// Multiply-accumulates of this GEMM.
    pub fn macs(&self) -> u64 {
        (self.m * self.k * self.n) as u64
    }
}

/// A validated submit, as the backends receive it.
#[doc(hidden)]
pub struct Submit<'a> {
    pub primitive: Primitive,
    pub gemms: Vec<MatMul<'a>>,
    pub c: &'a mut Buffer<i32>,
    pub cores: CoreMask,
    pub tiles: Tiles,
}

/// What one finished submit did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Hardware tasks per core.
    pub tasks_per_core: [u64; CoreMask::CORES],
    /// Bytes the device read and wrote (A, B, C).
    pub bytes: u64,
    pub macs: u64,
    /// Modelled RK3588 time of the submit in µs (emu only; never a measurement).
    pub modelled_us: Option<f64>,
    /// Runtime matmul contexts the submit had to create (rknn only: each is costly on the board).
    pub contexts_created: u64,
}
