//! The RK3588 NPU's native int8 matmul layouts.
//!
//! For `C[M,N] = A[M,K] · B[K,N]` the runtime and the hardware agree on:
//! - A (int8 activations): `[K/ak][M][ak]`, `ak` = 16;
//! - B (int8 weights):     `[N/bn][K/bk][bn][bk]`, `bn` = `bk` = 32 (element (n,k) at
//!   `(n/32)·32·K + (k/32)·32·32 + (n%32)·32 + k%32`);
//! - C (int32 outputs):    `[N/cn][M][cn]`, `cn` = 4.
//!
//! K and N are padded with zeros to a multiple of 32 ([`Tiles::align`]). The runtime reports the
//! tile sizes in its tensor attributes, so they are parameters ([`Tiles`]), not constants spread
//! around. A consequence the rest of the crate relies on: a run of whole N-tiles of B, and the
//! matching columns of C, are contiguous slices, so per-core tasks split work by N-tile ranges.

/// Tile sizes of the native layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    /// K elements per A tile row (`[K/a_k][M][a_k]`).
    pub a_k: usize,
    /// N (output channels) per B tile.
    pub b_n: usize,
    /// K per B tile.
    pub b_k: usize,
    /// N per C tile (`[N/c_n][M][c_n]`).
    pub c_n: usize,
    /// K and N are padded to multiples of this.
    pub align: usize,
}

impl Tiles {
    /// What the RK3588 runtime reports for INT8_MM_INT8_TO_INT32.
    pub const RK3588: Tiles = Tiles {
        a_k: 16,
        b_n: 32,
        b_k: 32,
        c_n: 4,
        align: 32,
    };

    /// `x` rounded up to the padding multiple.
    pub fn pad(&self, x: usize) -> usize {
        x.div_ceil(self.align) * self.align
    }

    /// Length of native A for `m` rows of padded depth `kp`.
    pub fn a_len(&self, m: usize, kp: usize) -> usize {
        m * kp
    }

    /// Length of native B for padded `kp` × `np`.
    pub fn b_len(&self, kp: usize, np: usize) -> usize {
        kp * np
    }

    /// Length of native C for `m` × padded `np`.
    pub fn c_len(&self, m: usize, np: usize) -> usize {
        m * np
    }

    /// Index of A element (row `m`, depth `k`) for `rows` rows in total.
    #[inline]
    pub fn a_index(&self, rows: usize, m: usize, k: usize) -> usize {
        (k / self.a_k) * rows * self.a_k + m * self.a_k + k % self.a_k
    }

    /// Index of B element (output channel `n`, depth `k`) for padded depth `kp`.
    #[inline]
    pub fn b_index(&self, kp: usize, n: usize, k: usize) -> usize {
        (n / self.b_n) * self.b_n * kp
            + (k / self.b_k) * self.b_n * self.b_k
            + (n % self.b_n) * self.b_k
            + k % self.b_k
    }

    /// Index of C element (row `m`, channel `n`) for `rows` rows in total.
    #[inline]
    pub fn c_index(&self, rows: usize, m: usize, n: usize) -> usize {
        (n / self.c_n) * rows * self.c_n + m * self.c_n + n % self.c_n
    }

    /// Splits padded depth `kp` into the fewest depth ranges of at most `max_k` each, as equal as
    /// whole `align`-deep blocks allow (larger first). A depth range of native A (`[K/a_k][M][a_k]`)
    /// is contiguous; of native B it is contiguous within each N-tile ([`Tiles::copy_b_depth`]).
    pub fn k_segments(&self, kp: usize, max_k: usize) -> Vec<(usize, usize)> {
        let blocks = kp / self.align;
        let per = (max_k / self.align).max(1);
        let parts = blocks.div_ceil(per).max(1);
        let (base, extra) = (blocks / parts, blocks % parts);
        let mut at = 0;
        (0..parts)
            .map(|i| {
                let len = (base + usize::from(i < extra)) * self.align;
                at += len;
                (at - len, at)
            })
            .collect()
    }

    /// Copies depth range `k0..k1` (multiples of `b_k`) of native B (`kp` × `np`) into `out` as a
    /// native B of depth `k1 - k0` × `np`.
    pub fn copy_b_depth(
        &self,
        b: &[i8],
        kp: usize,
        np: usize,
        (k0, k1): (usize, usize),
        out: &mut [i8],
    ) {
        let ks = k1 - k0;
        assert!(k0.is_multiple_of(self.b_k) && k1.is_multiple_of(self.b_k) && k1 <= kp);
        for (t, dst) in out[..self.b_len(ks, np)]
            .chunks_exact_mut(self.b_n * ks)
            .enumerate()
        {
            let tile = t * self.b_n * kp;
            dst.copy_from_slice(&b[tile + k0 * self.b_n..tile + k1 * self.b_n]);
        }
    }

    /// Packs row-major `a[m][k]` (`m` rows of `k`) into native A of padded depth `self.pad(k)`.
    pub fn pack_a(&self, a: &[i8], m: usize, k: usize, out: &mut [i8]) {
        let kp = self.pad(k);
        assert!(a.len() >= m * k && out.len() >= self.a_len(m, kp));
        out[..m * kp].fill(0);
        for r in 0..m {
            for c in 0..k {
                out[self.a_index(m, r, c)] = a[r * k + c];
            }
        }
    }

    /// Inverse of [`Tiles::pack_a`]: native A (padded depth) back to row-major `m × k`.
    pub fn unpack_a(&self, native: &[i8], m: usize, k: usize, out: &mut [i8]) {
        for r in 0..m {
            for c in 0..k {
                out[r * k + c] = native[self.a_index(m, r, c)];
            }
        }
    }

    /// Packs `w[n][k]` (ggml's order: one row of `k` weights per output channel) into native B of
    /// padded shape `self.pad(k)` × `self.pad(n)`; padding is zero.
    pub fn pack_b(&self, w: &[i8], n: usize, k: usize, out: &mut [i8]) {
        let (kp, np) = (self.pad(k), self.pad(n));
        assert!(w.len() >= n * k && out.len() >= self.b_len(kp, np));
        out[..kp * np].fill(0);
        for r in 0..n {
            for c in 0..k {
                out[self.b_index(kp, r, c)] = w[r * k + c];
            }
        }
    }

    /// Inverse of [`Tiles::pack_b`].
    pub fn unpack_b(&self, native: &[i8], n: usize, k: usize, out: &mut [i8]) {
        let kp = self.pad(k);
        for r in 0..n {
            for c in 0..k {
                out[r * k + c] = native[self.b_index(kp, r, c)];
            }
        }
    }

    /// Native C (`m` rows, padded width `np`) to row-major `m × n`, dropping padded channels.
    pub fn unpack_c(&self, native: &[i32], m: usize, n: usize, out: &mut [i32]) {
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = native[self.c_index(m, r, c)];
            }
        }
    }

    /// Row-major `m × n` into native C (padded width `self.pad(n)`, padding zero).
    pub fn pack_c(&self, c: &[i32], m: usize, n: usize, out: &mut [i32]) {
        let np = self.pad(n);
        out[..m * np].fill(0);
        for r in 0..m {
            for col in 0..n {
                out[self.c_index(m, r, col)] = c[r * n + col];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u32) -> Vec<i8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as i8)
            .collect()
    }

    #[test]
    fn b_index_matches_the_documented_formula() {
        let t = Tiles::RK3588;
        let kp = 96;
        for n in 0..64 {
            for k in 0..kp {
                let doc = (n / 32) * 32 * kp + (k / 32) * 32 * 32 + (n % 32) * 32 + (k % 32);
                assert_eq!(t.b_index(kp, n, k), doc);
            }
        }
    }

    #[test]
    fn round_trips_with_padding() {
        let t = Tiles::RK3588;
        for &(m, n, k) in &[
            (1, 32, 32),
            (3, 40, 50),
            (17, 64, 768),
            (5, 1, 1),
            (129, 33, 2048),
        ] {
            let (kp, np) = (t.pad(k), t.pad(n));
            let a = pattern(m * k, 1);
            let mut an = vec![7i8; t.a_len(m, kp)];
            t.pack_a(&a, m, k, &mut an);
            let mut back = vec![0i8; m * k];
            t.unpack_a(&an, m, k, &mut back);
            assert_eq!(a, back);
            assert_eq!(
                an.iter().filter(|&&x| x != 0).count(),
                a.iter().filter(|&&x| x != 0).count()
            );

            let w = pattern(n * k, 2);
            let mut bn = vec![7i8; t.b_len(kp, np)];
            t.pack_b(&w, n, k, &mut bn);
            let mut back = vec![0i8; n * k];
            t.unpack_b(&bn, n, k, &mut back);
            assert_eq!(w, back);
            assert_eq!(
                bn.iter().filter(|&&x| x != 0).count(),
                w.iter().filter(|&&x| x != 0).count()
            );

            let c: Vec<i32> = (0..(m * n) as i32).collect();
            let mut cn = vec![-1i32; t.c_len(m, np)];
            t.pack_c(&c, m, n, &mut cn);
            let mut back = vec![0i32; m * n];
            t.unpack_c(&cn, m, n, &mut back);
            assert_eq!(c, back);
        }
    }

    #[test]
    fn n_tile_runs_are_contiguous() {
        let t = Tiles::RK3588;
        let (m, kp) = (3, 64);
        // Channels 32..64 of B start right after the first N-tile; in C right after 32 channels.
        assert_eq!(t.b_index(kp, 32, 0), 32 * kp);
        assert_eq!(t.c_index(m, 0, 32), 32 * m);
    }

    #[test]
    fn depth_segments_cover_the_depth_and_copy_like_packing_a_slice() {
        let t = Tiles::RK3588;
        assert_eq!(t.k_segments(2048, 10240), [(0, 2048)]);
        assert_eq!(t.k_segments(14336, 8192), [(0, 7168), (7168, 14336)]);
        // 321 blocks of 32: 161 + 160.
        assert_eq!(t.k_segments(10272, 10240), [(0, 5152), (5152, 10272)]);
        for (kp, max_k) in [(8224, 8192), (16384, 8192), (96, 32), (64, 1)] {
            let segs = t.k_segments(kp, max_k);
            assert_eq!(segs[0].0, 0);
            assert_eq!(segs.last().unwrap().1, kp);
            assert!(segs.windows(2).all(|w| w[0].1 == w[1].0));
            assert!(segs
                .iter()
                .all(|&(a, b)| b - a <= max_k.max(32) && a % 32 == 0));
        }
        let (n, k) = (64, 160);
        let w = pattern(n * k, 4);
        let mut whole = vec![0i8; t.b_len(k, n)];
        t.pack_b(&w, n, k, &mut whole);
        for (k0, k1) in [(0, 64), (64, 160), (32, 96)] {
            let part: Vec<i8> = (0..n)
                .flat_map(|r| w[r * k + k0..r * k + k1].to_vec())
                .collect();
            let mut want = vec![0i8; t.b_len(k1 - k0, n)];
            t.pack_b(&part, n, k1 - k0, &mut want);
            let mut got = vec![0i8; want.len()];
            t.copy_b_depth(&whole, k, n, (k0, k1), &mut got);
            assert_eq!(got, want, "{k0}..{k1}");
        }
    }

    #[test]
    fn other_tile_sizes_round_trip() {
        let t = Tiles {
            a_k: 8,
            b_n: 16,
            b_k: 64,
            c_n: 8,
            align: 64,
        };
        let (n, k) = (20, 70);
        let w = pattern(n * k, 3);
        let mut bn = vec![0i8; t.b_len(t.pad(k), t.pad(n))];
        t.pack_b(&w, n, k, &mut bn);
        let mut back = vec![0i8; n * k];
        t.unpack_b(&bn, n, k, &mut back);
        assert_eq!(w, back);
    }
}
