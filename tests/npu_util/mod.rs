//! Helpers shared by the NPU tests: random operands, native packing, the reference result.
#![allow(dead_code)]

use ork_moe::gemm::{self, Shape};
use ork_moe::layout::Tiles;
use ork_moe::npu::{flags, Buffer, Device, MatMul};
use ork_moe::testutil::Rng;

/// Deterministic pseudo-random int8 covering -128..=127 (the crate's shared generator).
pub fn random_i8(len: usize, seed: u64) -> Vec<i8> {
    let mut v = vec![0i8; len];
    Rng::new(seed).fill_i8(&mut v);
    v
}

/// True when running on aarch64 (under qemu in CI): the sweeps shrink there.
pub fn slow_target() -> bool {
    cfg!(target_arch = "aarch64") || std::env::var_os("ORK_TEST_SMALL").is_some()
}

/// One GEMM's operands in native layouts plus the reference result.
pub struct Case {
    pub m: usize,
    pub kp: usize,
    pub np: usize,
    pub a: Vec<i8>,
    pub b: Vec<i8>,
    pub expected: Vec<i32>,
}

impl Case {
    /// Random row-major operands of the real (unpadded) sizes, packed with zero padding.
    pub fn random(m: usize, k: usize, n: usize, seed: u64) -> Case {
        Case::from_rows(
            m,
            k,
            n,
            &random_i8(m * k, seed),
            &random_i8(n * k, seed + 1),
        )
    }

    /// From row-major `a[m][k]` and ggml-ordered `w[n][k]`.
    pub fn from_rows(m: usize, k: usize, n: usize, a_rows: &[i8], w: &[i8]) -> Case {
        let t = Tiles::RK3588;
        let (kp, np) = (t.pad(k), t.pad(n));
        let mut a = vec![0i8; t.a_len(m, kp)];
        t.pack_a(a_rows, m, k, &mut a);
        let mut b = vec![0i8; t.b_len(kp, np)];
        t.pack_b(w, n, k, &mut b);
        let mut expected = vec![0i32; t.c_len(m, np)];
        gemm::reference(&t, Shape { m, kp, np }, &a, &b, &mut expected);
        Case {
            m,
            kp,
            np,
            a,
            b,
            expected,
        }
    }

    /// The same B with native `a` (of this case's length) for A, and its reference result.
    pub fn with_native_a(&self, a: Vec<i8>) -> Case {
        let t = Tiles::RK3588;
        assert_eq!(a.len(), self.a.len());
        let mut expected = vec![0i32; self.expected.len()];
        let shape = Shape {
            m: self.m,
            kp: self.kp,
            np: self.np,
        };
        gemm::reference(&t, shape, &a, &self.b, &mut expected);
        Case {
            a,
            b: self.b.clone(),
            expected,
            ..*self
        }
    }

    /// Device buffers (A, B, C) filled and synced, in `domain`.
    pub fn upload(
        &self,
        dev: &Device,
        flags: u32,
        domain: u32,
    ) -> (Buffer<i8>, Buffer<i8>, Buffer<i32>) {
        let mut a = dev.alloc::<i8>(self.a.len(), flags, domain).unwrap();
        a.write(0, &self.a).unwrap();
        a.sync_to_device().unwrap();
        let mut b = dev.alloc::<i8>(self.b.len(), flags, domain).unwrap();
        b.write(0, &self.b).unwrap();
        b.sync_to_device().unwrap();
        let c = dev
            .alloc::<i32>(self.expected.len(), flags, domain)
            .unwrap();
        (a, b, c)
    }

    pub fn matmul<'a>(&self, a: &'a Buffer<i8>, b: &'a Buffer<i8>) -> MatMul<'a> {
        MatMul {
            m: self.m,
            k: self.kp,
            n: self.np,
            a,
            a_offset: 0,
            b,
            b_offset: 0,
            c_offset: 0,
        }
    }

    /// Runs the case with `run_i8` and returns C as the CPU sees it after syncing.
    pub fn run(&self, dev: &Device) -> Vec<i32> {
        let (a, b, mut c) = self.upload(dev, flags::CPU_FILLED, 0);
        dev.run_i8(self.matmul(&a, &b), &mut c).unwrap();
        c.sync_from_device().unwrap();
        c.as_slice().to_vec()
    }
}

/// The A3B expert shapes (K, N).
pub const A3B: [(usize, usize); 4] = [(2048, 768), (768, 2048), (4096, 1408), (1408, 4096)];
/// The row counts every backend must get right.
pub const ROWS: [usize; 10] = [1, 2, 3, 4, 8, 16, 32, 64, 128, 129];
