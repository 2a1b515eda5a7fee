//! Repacking of the native operands into the order the fast kernels stream.
//!
//! In native layout, the k-run of one channel of B recurs every 1 KiB (`[K/32][32n][32k]`), and the
//! k-run of one row of A every `16·M` bytes: a kernel working on a few channels and rows touches only
//! a fraction of the L1 cache sets and evicts its own data once the depth is large. Copied into
//! contiguous panels, the same data fills the cache evenly. A is repacked once per GEMM, B one
//! group of channels at a time (amortized over all rows).

/// A `len`-element slice of `buf` starting on a 64-byte boundary: vector loads that straddle two
/// cache lines slow the kernels by about a quarter.
pub(super) fn aligned<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    buf.resize(len + 64 / size_of::<T>(), T::default());
    let start = buf.as_ptr().align_offset(64);
    &mut buf[start..start + len]
}

/// Copies 16 elements, converted; fixed-size so that it compiles to a few vector instructions.
//
// The packers are `inline(always)` so that they take the vector width of the kernel that calls them.
#[inline(always)]
fn copy16<T: Copy>(dst: &mut [T], src: &[i8], conv: &impl Fn(i8) -> T) {
    let dst: &mut [T; 16] = (&mut dst[..16]).try_into().expect("16 elements");
    let src: &[i8; 16] = src[..16].try_into().expect("16 elements");
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = conv(x);
    }
}

/// Native A (`[K/16][M][16]`, `m` rows, depth `kp`) into panels of `rows` rows (the last may be
/// shorter): the panel of rows `r0..r0+R` starts at `r0·kp` and is laid out `[K/w][R][w]`, `w` =
/// 16 or 32, each element converted by `conv`.
#[inline(always)]
pub(super) fn a_panels<T: Copy>(
    m: usize,
    kp: usize,
    a: &[i8],
    rows: usize,
    w: usize,
    out: &mut [T],
    conv: impl Fn(i8) -> T,
) {
    debug_assert!(w == 16 || w == 32);
    for r0 in (0..m).step_by(rows) {
        let r = (m - r0).min(rows);
        for kc in 0..kp / w {
            for i in 0..r {
                for part in 0..w / 16 {
                    let src = ((kc * w / 16 + part) * m + r0 + i) * 16;
                    copy16(
                        &mut out[r0 * kp + (kc * r + i) * w + part * 16..],
                        &a[src..],
                        &conv,
                    );
                }
            }
        }
    }
}

/// Channels `n0..n0+g` of native B (`[N/32][K/32][32n][32k]`, depth `kp`) into `[K/w][g][w]`,
/// `w` = 16 or 32, each element converted by `conv`. The channels must lie in one N-tile.
#[inline(always)]
pub(super) fn b_group<T: Copy>(
    kp: usize,
    b: &[i8],
    n0: usize,
    g: usize,
    w: usize,
    out: &mut [T],
    conv: impl Fn(i8) -> T,
) {
    debug_assert!((w == 16 || w == 32) && n0 % 32 + g <= 32);
    let tile = (n0 / 32) * 32 * kp;
    for kb in 0..kp / 32 {
        // The group's 32 k of this block: g channel runs of 32, back to back.
        let src = &b[tile + kb * 32 * 32 + (n0 % 32) * 32..][..g * 32];
        if w == 32 {
            for (d, &x) in out[kb * g * 32..][..g * 32].iter_mut().zip(src) {
                *d = conv(x);
            }
        } else {
            for (j, run) in src.chunks_exact(32).enumerate() {
                copy16(&mut out[(2 * kb * g + j) * 16..], run, &conv);
                copy16(&mut out[((2 * kb + 1) * g + j) * 16..], &run[16..], &conv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Tiles;

    #[test]
    fn panels_hold_the_same_elements() {
        let t = Tiles::RK3588;
        let (m, kp, np) = (7, 96, 64);
        let a: Vec<i8> = (0..t.a_len(m, kp)).map(|i| (i * 7 % 251) as i8).collect();
        let b: Vec<i8> = (0..t.b_len(kp, np)).map(|i| (i * 13 % 253) as i8).collect();
        for (rows, w) in [(4, 32), (2, 16), (4, 16)] {
            let mut out = vec![0i16; m * kp];
            a_panels(m, kp, &a, rows, w, &mut out, |x| x as i16);
            for r in 0..m {
                let (r0, pr) = (r / rows * rows, (m - r / rows * rows).min(rows));
                for k in 0..kp {
                    let at = r0 * kp + ((k / w) * pr + r - r0) * w + k % w;
                    assert_eq!(
                        out[at],
                        a[t.a_index(m, r, k)] as i16,
                        "rows {rows} w {w} r {r} k {k}"
                    );
                }
            }
        }
        for (n0, g, w) in [(40, 8, 32), (36, 4, 16), (0, 4, 32)] {
            let mut out = vec![0i8; g * kp];
            b_group(kp, &b, n0, g, w, &mut out, |x| x);
            for j in 0..g {
                for k in 0..kp {
                    assert_eq!(
                        out[((k / w) * g + j) * w + k % w],
                        b[t.b_index(kp, n0 + j, k)]
                    );
                }
            }
        }
    }
}
