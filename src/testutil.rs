//! Deterministic random data for tests and benchmarks (not part of the supported API).
//!
//! One small PRNG for the whole crate, so test inputs are reproducible from a seed on every
//! platform (qemu included) without a dependency, plus generators of plausible quantized expert
//! weights for every [`GgmlType::QUANTIZED`] type.

use crate::quant::fp16::f32_to_f16;
use crate::quant::GgmlType;

/// SplitMix64: tiny, fast, and good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant for test data).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.fill_bytes(&mut v);
        v
    }
}

/// Byte offsets of the fp16 scale fields inside one block of `ty` (for injecting special values).
pub fn fp16_field_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::F32 | GgmlType::F16 => &[],
    }
}

/// `n` rows of `k` weights of `ty`, rows packed back to back: random quants and scales of the
/// magnitudes and signs ggml's quantizers produce (positive `d`, non-positive Q4_1 `m`, Q8_0
/// quants in -127..=127, signed Q6_K sub-block scales). Panics unless `k` is whole blocks.
pub fn random_expert(ty: GgmlType, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let row_bytes = ty.row_bytes(k).expect("k is a whole number of blocks");
    let mut data = rng.bytes(n * row_bytes);
    let half = |x: f32| f32_to_f16(x).to_le_bytes();
    for block in data.chunks_exact_mut(ty.block_bytes()) {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 => {
                block[..2].copy_from_slice(&half(rng.uniform(1e-3, 4e-2)))
            }
            GgmlType::Q4_1 => {
                block[..2].copy_from_slice(&half(rng.uniform(1e-3, 4e-2)));
                block[2..4].copy_from_slice(&half(rng.uniform(-0.3, 0.0)));
            }
            GgmlType::Q8_0 => {
                block[..2].copy_from_slice(&half(rng.uniform(1e-4, 2e-3)));
                for q in &mut block[2..] {
                    if *q == 0x80 {
                        *q = 0x81; // ggml's quantizer never emits -128
                    }
                }
            }
            GgmlType::Q4_K => {
                block[..2].copy_from_slice(&half(rng.uniform(1e-4, 2e-3)));
                block[2..4].copy_from_slice(&half(rng.uniform(1e-4, 2e-3)));
            }
            GgmlType::Q6_K => block[208..].copy_from_slice(&half(rng.uniform(1e-4, 2e-3))),
            GgmlType::F32 | GgmlType::F16 => unreachable!("not a block type"),
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_spread() {
        let a: Vec<u64> = (0..4)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        let mut r = Rng::new(1);
        let mean = (0..10_000).map(|_| r.uniform(0.0, 1.0) as f64).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }

    #[test]
    fn random_expert_has_whole_rows() {
        for ty in GgmlType::QUANTIZED {
            let k = 256;
            let data = random_expert(ty, 3, k, &mut Rng::new(1));
            assert_eq!(data.len(), 3 * ty.row_bytes(k).unwrap());
        }
    }
}
