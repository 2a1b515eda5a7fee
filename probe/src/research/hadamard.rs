//! An orthogonal rotation over K that spreads outlier channels: `R = H · D / √K`, with `D` a
//! fixed pseudo-random diagonal of ±1 and `H` a ±1 Hadamard matrix of order K.
//!
//! Why: `y = W·x = (W·Rᵀ)·(R·x)` for any orthogonal `R`. A Hadamard rotation turns one channel
//! of magnitude `A` into K channels of magnitude `A/√K`, so the int8 scale of a rotated row is
//! set by the row's energy, not by its largest channel (QuaRot; rk-llama.cpp's W8A8 "online
//! Hadamard"). `D` keeps `H` from doing the opposite to structured rows: `H` alone maps a
//! constant row (a mean, as GELU outputs have) onto channel 0, a new outlier; with random
//! signs no fixed pattern lines up with a row of `H`.
//!
//! `H` for `K = m·2ⁿ` (`m` odd):
//! - `m = 1`: Sylvester–Walsh `H_{2ⁿ}`;
//! - else, when some `p = m·2ᵃ` (`2 ≤ a ≤ n`) has `p − 1` a prime `≡ 3 (mod 4)`: the Kronecker
//!   product `H_p ⊗ H_{2ⁿ⁻ᵃ}`, `H_p` from Paley's first construction (K = 768 = 12·64,
//!   1408 = 44·32, 384 = 12·32, 1536 = 12·128: every A3B and test shape). A Kronecker product of
//!   Hadamard matrices is a Hadamard matrix of order K, so every output mixes every input with
//!   weight `±1/√K`: the full benefit, as for a power of two;
//! - otherwise block-diagonal: `K/2ⁿ` blocks of `H_{2ⁿ}`. Each block is a full rotation of its
//!   `2ⁿ ≥ 32` channels (K is a whole number of 32-blocks), so an outlier is spread over its
//!   block only: a factor `√(2ⁿ)` instead of `√K`.
//!
//! Cost: `K·(n − a)` additions for the Walsh part (fast transform) and `K·p` for the dense
//! Paley part, one multiply per value. The arithmetic is plain binary32 in a fixed
//! order, so every caller (activations per call, weights at inflate) gets the same bits.

/// The rotation for one K. Build once per K and share.
#[derive(Clone, Debug)]
pub struct Rotation {
    k: usize,
    /// Order of the Walsh factor (a power of two; the block size when block-diagonal).
    walsh: usize,
    /// The Paley factor, row-major `p × p` of ±1, or empty (`p = 1`).
    paley: Vec<i8>,
    /// `D`: ±1 per channel.
    signs: Vec<f32>,
    /// `1/√(order of H)`; block-diagonal: `1/√walsh`.
    norm: f32,
}

/// How [`Rotation`] factors K, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Construction {
    /// `H_p ⊗ H_walsh` (`p = 1`: Walsh alone), one Hadamard matrix of order K.
    Kronecker { paley: usize, walsh: usize },
    /// `K / walsh` blocks of `H_walsh`.
    BlockDiagonal { walsh: usize },
}

impl std::fmt::Display for Construction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Construction::Kronecker { paley: 1, walsh } => write!(f, "H{walsh}"),
            Construction::Kronecker { paley, walsh } => write!(f, "H{paley}(Paley)⊗H{walsh}"),
            Construction::BlockDiagonal { walsh } => write!(f, "blockdiag H{walsh}"),
        }
    }
}

fn is_prime(n: usize) -> bool {
    n >= 2
        && (2..)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

/// Paley I: for a prime `q ≡ 3 (mod 4)`, `H = I + [[0, 1ᵀ], [−1, Q]]` with `Q[i][j] = χ(j − i)`
/// (the quadratic character mod q) is a (skew) Hadamard matrix of order `q + 1`.
fn paley(q: usize) -> Vec<i8> {
    let p = q + 1;
    let mut residue = vec![false; q];
    for x in 1..q {
        residue[x * x % q] = true;
    }
    let chi = |v: usize| -> i8 {
        match v % q {
            0 => 0,
            v if residue[v] => 1,
            _ => -1,
        }
    };
    let mut h = vec![0i8; p * p];
    for i in 0..p {
        for j in 0..p {
            let s = match (i, j) {
                (0, 0) => 0,
                (0, _) => 1,
                (_, 0) => -1,
                _ => chi(j + q - i),
            };
            h[i * p + j] = s + (i == j) as i8;
        }
    }
    h
}

/// The fixed ±1 of channel `i` (a SplitMix64 bit): part of the rotation's definition.
fn sign(i: usize) -> f32 {
    let mut z = (i as u64).wrapping_add(0x6a09_e667_f3bc_c909);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    if (z ^ (z >> 31)) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// In-place fast Walsh–Hadamard transform (unnormalized) of `x` (length a power of two), on `L`
/// interleaved vectors at once (`x[i][lane]`; `L = 1` is one vector). Every lane sees the same
/// operations in the same order, so lanes are bit-identical to separate transforms.
fn fwht<const L: usize>(x: &mut [[f32; L]]) {
    let mut h = 1;
    while h < x.len() {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b) {
                for l in 0..L {
                    (u[l], v[l]) = (u[l] + v[l], u[l] - v[l]);
                }
            }
        }
        h *= 2;
    }
}

impl Rotation {
    /// The rotation of order `k` (`k > 0`, a multiple of 32 as every GGML row is).
    pub fn new(k: usize) -> Rotation {
        assert!(
            k > 0 && k.is_multiple_of(32),
            "K = {k} is not a multiple of 32"
        );
        let pow2 = 1usize << k.trailing_zeros();
        let odd = k / pow2;
        let paley_order = (2..=pow2.trailing_zeros())
            .map(|a| odd << a)
            .find(|&p| is_prime(p - 1) && (p - 1) % 4 == 3);
        let (walsh, paley_m, norm) = match paley_order {
            _ if odd == 1 => (k, Vec::new(), (k as f32).sqrt().recip()),
            Some(p) => (k / p, paley(p - 1), (k as f32).sqrt().recip()),
            None => (pow2, Vec::new(), (pow2 as f32).sqrt().recip()),
        };
        Rotation {
            k,
            walsh,
            paley: paley_m,
            signs: (0..k).map(sign).collect(),
            norm,
        }
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn construction(&self) -> Construction {
        match self.paley_order() {
            p if p * self.walsh == self.k => Construction::Kronecker {
                paley: p,
                walsh: self.walsh,
            },
            _ => Construction::BlockDiagonal { walsh: self.walsh },
        }
    }

    /// `p` of the Paley factor (1 when there is none).
    fn paley_order(&self) -> usize {
        (1..).find(|p| p * p >= self.paley.len()).expect("finite")
    }

    /// `out = R · x` (`x` and `out` of length K).
    pub fn apply(&self, x: &[f32], out: &mut [f32]) {
        assert!(x.len() == self.k && out.len() == self.k, "length != K");
        let v: &mut [[f32; 1]] = as_lanes(out);
        for ((o, &xi), &s) in v.iter_mut().zip(x).zip(&self.signs) {
            o[0] = xi * s;
        }
        self.transform(v);
    }

    /// `x[·][lane] = R · x[·][lane]` in place for `L` interleaved vectors of length K (the rotated
    /// inflate rotates 16 weight rows at once: every butterfly becomes one vector operation).
    /// Bit-identical to [`Rotation::apply`] of each lane.
    pub fn apply_lanes<const L: usize>(&self, x: &mut [[f32; L]]) {
        assert_eq!(x.len(), self.k, "length != K");
        for (v, &s) in x.iter_mut().zip(&self.signs) {
            for e in v.iter_mut() {
                *e *= s;
            }
        }
        self.transform(x);
    }

    /// `H` then the normalization, on sign-flipped lanes.
    fn transform<const L: usize>(&self, x: &mut [[f32; L]]) {
        for block in x.chunks_exact_mut(self.walsh) {
            fwht(block);
        }
        let p = self.paley_order();
        if p > 1 {
            // Element (i, j) of the p × walsh view is channel i·walsh + j: H_p mixes the rows.
            let w = self.walsh;
            let mut col = vec![[0f32; L]; p];
            for j in 0..w {
                for (i, c) in col.iter_mut().enumerate() {
                    *c = x[i * w + j];
                }
                for i in 0..p {
                    let row = &self.paley[i * p..(i + 1) * p];
                    let mut acc = [0f32; L];
                    for (&h, c) in row.iter().zip(&col) {
                        for l in 0..L {
                            acc[l] = if h > 0 { acc[l] + c[l] } else { acc[l] - c[l] };
                        }
                    }
                    x[i * w + j] = acc;
                }
            }
        }
        for v in x.iter_mut() {
            for e in v.iter_mut() {
                *e *= self.norm;
            }
        }
    }
}

/// `out` viewed as one-lane vectors (`[f32; 1]` has the layout of `f32`).
fn as_lanes(out: &mut [f32]) -> &mut [[f32; 1]] {
    out.as_chunks_mut::<1>().0
}

#[cfg(test)]
mod tests {
    use super::*;
    use ork_moe::testutil::Rng;

    #[test]
    fn paley_matrices_are_hadamard() {
        for q in [3usize, 11, 19, 43] {
            let p = q + 1;
            let h = paley(q);
            for i in 0..p {
                for j in 0..p {
                    let dot: i32 = (0..p)
                        .map(|t| h[i * p + t] as i32 * h[j * p + t] as i32)
                        .sum();
                    assert_eq!(dot, if i == j { p as i32 } else { 0 }, "q={q} ({i},{j})");
                }
            }
        }
    }

    #[test]
    fn constructions_of_the_model_shapes() {
        let c = |k| Rotation::new(k).construction();
        assert_eq!(
            c(2048),
            Construction::Kronecker {
                paley: 1,
                walsh: 2048
            }
        );
        assert_eq!(
            c(768),
            Construction::Kronecker {
                paley: 12,
                walsh: 64
            }
        );
        assert_eq!(
            c(1408),
            Construction::Kronecker {
                paley: 44,
                walsh: 32
            }
        );
        assert_eq!(
            c(384),
            Construction::Kronecker {
                paley: 12,
                walsh: 32
            }
        );
        assert_eq!(
            c(1536),
            Construction::Kronecker {
                paley: 12,
                walsh: 128
            }
        );
        // 7·32: 28, 56, 112 − 1 are not primes ≡ 3 mod 4, and 224 needs 2⁵ ≤ 32 → 223 works.
        assert_eq!(
            c(224),
            Construction::Kronecker {
                paley: 224,
                walsh: 1
            }
        );
        // 5·32 = 160: 20 − 1 = 19 ✓.
        assert_eq!(
            c(160),
            Construction::Kronecker {
                paley: 20,
                walsh: 8
            }
        );
        // 17·32: 68−1 = 67 ✓ (67 ≡ 3 mod 4).
        assert_eq!(
            c(544),
            Construction::Kronecker {
                paley: 68,
                walsh: 8
            }
        );
        // 13·32: 52−1 = 51 = 3·17, 104−1 = 103 ✓.
        assert_eq!(
            c(416),
            Construction::Kronecker {
                paley: 104,
                walsh: 4
            }
        );
        // 31·32: 124−1 = 123 = 3·41, 248−1 = 247 = 13·19, 496−1 = 495, 992−1 = 991 ≡ 3 ✓.
        assert_eq!(
            c(992),
            Construction::Kronecker {
                paley: 992,
                walsh: 1
            }
        );
        // 85·32: 340−1 = 339 = 3·113, 679 = 7·97, 1359 = 3²·151, 2719 ≡ 3 prime ✓ (a = 5).
        assert_eq!(
            c(2720),
            Construction::Kronecker {
                paley: 2720,
                walsh: 1
            }
        );
        // No Paley order with a ≤ n: blocks. 51·32 (203, 407, 815, 1631 all composite) and
        // 73·32 (291, 583, 1167, 2335).
        assert_eq!(c(1632), Construction::BlockDiagonal { walsh: 32 });
        assert_eq!(c(2336), Construction::BlockDiagonal { walsh: 32 });
    }

    fn dense(rot: &Rotation) -> Vec<f64> {
        let k = rot.k();
        let mut m = vec![0f64; k * k];
        let (mut e, mut col) = (vec![0f32; k], vec![0f32; k]);
        for j in 0..k {
            e.fill(0.0);
            e[j] = 1.0;
            rot.apply(&e, &mut col);
            for i in 0..k {
                m[i * k + j] = col[i] as f64;
            }
        }
        m
    }

    #[test]
    fn rotations_are_orthogonal_and_flat() {
        for k in [32usize, 96, 160, 384, 768] {
            let rot = Rotation::new(k);
            let m = dense(&rot);
            let flat = match rot.construction() {
                Construction::Kronecker { .. } => 1.0 / (k as f64).sqrt(),
                Construction::BlockDiagonal { walsh } => 1.0 / (walsh as f64).sqrt(),
            };
            for i in 0..k {
                for j in 0..k {
                    let dot: f64 = (0..k).map(|t| m[i * k + t] * m[j * k + t]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-5, "K={k} ({i},{j}) {dot}");
                }
                if let Construction::Kronecker { .. } = rot.construction() {
                    assert!(m[i * k..(i + 1) * k]
                        .iter()
                        .all(|&v| ((v.abs() - flat) / flat).abs() < 1e-6));
                }
            }
        }
    }

    #[test]
    fn large_and_block_diagonal_rotations_keep_norms_and_dots() {
        let mut rng = Rng::new(9);
        for k in [1632usize, 2048, 4096] {
            let rot = Rotation::new(k);
            let a: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
            let b: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
            let (mut ra, mut rb) = (vec![0f32; k], vec![0f32; k]);
            rot.apply(&a, &mut ra);
            rot.apply(&b, &mut rb);
            let dot = |x: &[f32], y: &[f32]| {
                x.iter()
                    .zip(y)
                    .map(|(p, q)| *p as f64 * *q as f64)
                    .sum::<f64>()
            };
            let n = (dot(&a, &a) * dot(&b, &b)).sqrt();
            assert!(
                (dot(&a, &a) - dot(&ra, &ra)).abs() < 1e-5 * dot(&a, &a),
                "K={k}"
            );
            assert!((dot(&a, &b) - dot(&ra, &rb)).abs() < 1e-5 * n, "K={k}");
        }
    }

    #[test]
    fn lanes_are_bit_identical_to_single_rotations() {
        let mut rng = Rng::new(21);
        for k in [768usize, 1408, 2048, 1632] {
            let rot = Rotation::new(k);
            let rows: Vec<Vec<f32>> = (0..16)
                .map(|_| (0..k).map(|_| rng.normal()).collect())
                .collect();
            let mut lanes = vec![[0f32; 16]; k];
            for (l, r) in rows.iter().enumerate() {
                for (c, &v) in r.iter().enumerate() {
                    lanes[c][l] = v;
                }
            }
            rot.apply_lanes(&mut lanes);
            let mut one = vec![0f32; k];
            for (l, r) in rows.iter().enumerate() {
                rot.apply(r, &mut one);
                for c in 0..k {
                    assert_eq!(
                        one[c].to_bits(),
                        lanes[c][l].to_bits(),
                        "K={k} lane {l} ch {c}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_outlier_is_spread_and_the_dot_product_kept() {
        let k = 768;
        let rot = Rotation::new(k);
        let mut rng = Rng::new(5);
        let mut x: Vec<f32> = (0..k).map(|_| rng.uniform(-1.0, 1.0)).collect();
        x[7] = 100.0;
        let w: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
        let (mut rx, mut rw) = (vec![0f32; k], vec![0f32; k]);
        rot.apply(&x, &mut rx);
        rot.apply(&w, &mut rw);
        let amax = |v: &[f32]| v.iter().fold(0f32, |m, a| m.max(a.abs()));
        let rms = |v: &[f32]| (v.iter().map(|a| a * a).sum::<f32>() / v.len() as f32).sqrt();
        assert!(amax(&x) / rms(&x) > 25.0);
        assert!(amax(&rx) / rms(&rx) < 6.0, "{}", amax(&rx) / rms(&rx));
        let dot = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(p, q)| *p as f64 * *q as f64)
                .sum::<f64>()
        };
        assert!(
            (dot(&x, &w) - dot(&rx, &rw)).abs() < 1e-3 * dot(&x, &x).sqrt() * dot(&w, &w).sqrt()
        );
    }
}
