//! The k-quants beside Q4_K and Q6_K: Q2_K, Q3_K and Q5_K (`ggml-common.h`, `ggml-quants.c`).

use super::blocks::{byte_block, half, q4k_scale_min, Block, K_SCALE_SIZE, QK_K};
use super::GgmlType;

byte_block! {
    /// `block_q2_K`: 256 weights in 16 sub-blocks of 16, `d*(sc[j] & 15) * q2 - dmin*(sc[j] >> 4)`.
    BlockQ2K, 84 {
        scales: QK_K / 16,
        qs: QK_K / 4,
        d: 2,
        dmin: 2,
    }
}

byte_block! {
    /// `block_q3_K`: 256 weights in 16 sub-blocks of 16, `d*(sc[j] - 32) * (q2 - 4·!hbit)` with
    /// 6-bit `sc` packed in `scales` (see [`q3k_scales`]).
    BlockQ3K, 110 {
        hmask: QK_K / 8,
        qs: QK_K / 4,
        scales: 12,
        d: 2,
    }
}

byte_block! {
    /// `block_q5_K`: 256 weights in 8 sub-blocks of 32, `d*sc[j] * q5 - dmin*m[j]` with `sc`/`m`
    /// packed as Q4_K's; the fifth bits in `qh` (bit `j` of `qh[l]` for sub-block `j`).
    BlockQ5K, 176 {
        d: 2,
        dmin: 2,
        scales: K_SCALE_SIZE,
        qh: QK_K / 8,
        qs: QK_K / 2,
    }
}

/// The 16 sub-block scales of a Q3_K super-block, `sc - 32` (ggml unpacks them with the `aux`
/// word shuffle in `dequantize_row_q3_K`): the low four bits of scale `j` are nibble `j / 8` of
/// byte `j % 8`, the high two are bits `2·(j / 4)` of byte `8 + j % 4`.
pub fn q3k_scales(packed: &[u8; 12]) -> [i8; 16] {
    std::array::from_fn(|j| {
        let low = (packed[j % 8] >> (4 * (j / 8))) & 0x0f;
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

impl Block for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 84;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        let min = half(self.dmin);
        let mut y = y.iter_mut();
        for (n, q) in self.qs.chunks_exact(32).enumerate() {
            for j in 0..4 {
                let shift = 2 * j;
                for (half_run, q) in q.chunks_exact(16).enumerate() {
                    let sc = self.scales[8 * n + 2 * j + half_run];
                    let dl = d * (sc & 0x0f) as f32;
                    let ml = min * (sc >> 4) as f32;
                    // `q` first: zip polls its first iterator first, and `y` must not lose a weight.
                    for (&q, y) in q.iter().zip(y.by_ref()) {
                        *y = dl * ((q >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

impl Block for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 110;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d_all = half(self.d);
        let scales = q3k_scales(&self.scales);
        let mut y = y.iter_mut();
        for (n, q) in self.qs.chunks_exact(32).enumerate() {
            for j in 0..4 {
                let (shift, m) = (2 * j, 1u8 << (4 * n + j));
                for half_run in 0..2 {
                    let dl = d_all * scales[8 * n + 2 * j + half_run] as f32;
                    let at = 16 * half_run;
                    let (q, hm) = (&q[at..at + 16], &self.hmask[at..at + 16]);
                    for (&q, &hm) in q.iter().zip(hm) {
                        let c = ((q >> shift) & 3) as i32 - if hm & m != 0 { 0 } else { 4 };
                        *y.next().expect("256 weights") = dl * c as f32;
                    }
                }
            }
        }
    }
}

impl Block for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 176;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        let min = half(self.dmin);
        for chunk in 0..4 {
            let ql = &self.qs[chunk * 32..chunk * 32 + 32];
            let (sc0, m0) = q4k_scale_min(2 * chunk, &self.scales);
            let (sc1, m1) = q4k_scale_min(2 * chunk + 1, &self.scales);
            let (d1, m1f) = (d * sc0 as f32, min * m0 as f32);
            let (d2, m2f) = (d * sc1 as f32, min * m1 as f32);
            let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
            let y = &mut y[chunk * 64..chunk * 64 + 64];
            for l in 0..32 {
                let h1 = if self.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if self.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - m1f;
                y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2f;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q3k_scales_is_ggmls_word_shuffle() {
        // ggml's unpacking in dequantize_row_q3_K, transcribed.
        fn ggml(packed: &[u8; 12]) -> [i8; 16] {
            let word = |i: usize| u32::from_le_bytes(packed[4 * i..4 * i + 4].try_into().unwrap());
            let (kmask1, kmask2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
            let (a0, a1, tmp) = (word(0), word(1), word(2));
            let aux = [
                (a0 & kmask2) | ((tmp & kmask1) << 4),
                (a1 & kmask2) | (((tmp >> 2) & kmask1) << 4),
                ((a0 >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4),
                ((a1 >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4),
            ];
            std::array::from_fn(|j| (aux[j / 4].to_le_bytes()[j % 4] as i8).wrapping_sub(32))
        }
        let mut rng = crate::testutil::Rng::new(17);
        for _ in 0..1000 {
            let mut packed = [0u8; 12];
            rng.fill_bytes(&mut packed);
            assert_eq!(q3k_scales(&packed), ggml(&packed), "{packed:?}");
        }
    }
}
