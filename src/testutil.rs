//! Deterministic pseudo-random data for tests, benchmarks and the probe.
//!
//! Not part of the C ABI; public so integration tests and tools share one generator instead of
//! each growing its own.

use crate::quant::fp16::f32_to_f16;
use crate::quant::GgmlType;

/// SplitMix64: tiny, fast, and good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// Approximately standard normal (sum of four uniforms, rescaled).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum();
        (s - 2.0) * 1.732_050_8
    }

    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    pub fn fill_i8(&mut self, out: &mut [i8]) {
        for x in out.iter_mut() {
            *x = self.next_u32() as i8;
        }
    }

    /// `n` bytes of valid blocks of `ty`: random quants and scales drawn like real weights'
    /// (fp16 scale fields finite, around `scale`; MXFP4's power-of-two scale within two binades
    /// of `scale`'s).
    pub fn blocks(&mut self, ty: GgmlType, n_blocks: usize, scale: f32) -> Vec<u8> {
        let bb = ty.block_bytes();
        let mut out = vec![0u8; n_blocks * bb];
        self.fill_bytes(&mut out);
        for block in out.chunks_exact_mut(bb) {
            for off in half_offsets(ty) {
                let h = f32_to_f16(self.uniform(-scale, scale));
                block[*off..*off + 2].copy_from_slice(&h.to_le_bytes());
            }
            match ty {
                GgmlType::IQ1_M => set_iq1m_scale(block, f32_to_f16(self.uniform(-scale, scale))),
                GgmlType::MXFP4 => {
                    let e = 128 + scale.log2().round() as i32 - 2 + self.below(5) as i32;
                    block[0] = e.clamp(0, 254) as u8;
                }
                _ => {}
            }
        }
        out
    }
}

/// Byte offsets of the fp16 fields stored whole in a block of `ty` (IQ1_M spreads its one
/// over four nibbles, [`set_iq1m_scale`]; MXFP4's scale is an E8M0 byte).
pub fn half_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ1_S
        | GgmlType::IQ4_NL
        | GgmlType::IQ4_XS => &[0],
        GgmlType::IQ1_M | GgmlType::MXFP4 | GgmlType::F32 | GgmlType::F16 => &[],
    }
}

/// Writes the fp16 bits `h` as an IQ1_M block's scale: the top nibbles of its four
/// little-endian scale words (bytes 48..56).
pub fn set_iq1m_scale(block: &mut [u8], h: u16) {
    for i in 0..4 {
        let at = 48 + 2 * i + 1;
        block[at] = (block[at] & 0x0f) | ((((h >> (4 * i)) & 0x0f) as u8) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    #[test]
    fn deterministic_and_blocks_are_finite() {
        assert_eq!(Rng::new(7).next_u64(), Rng::new(7).next_u64());
        let mut rng = Rng::new(1);
        for ty in GgmlType::QUANTIZED {
            let k = 512;
            let bytes = rng.blocks(ty, k / ty.block_elems(), 0.05);
            let mut w = vec![0f32; k];
            dequantize_row(ty, &bytes, &mut w).unwrap();
            assert!(w.iter().all(|x| x.is_finite()), "{}", ty.name());
            assert!(w.iter().any(|&x| x != 0.0), "{}", ty.name());
        }
    }
}
