//! Where a strided tensor's bytes lie: runs of `inner` bytes (rows, or elements) at the offsets
//! of its two outer dimensions. Its byte extent, whether its runs are distinct, and whether two
//! tensors share a byte, from metadata only.

/// Bytes spanned by a tensor whose innermost run is `inner` bytes, with `(count, stride)` for each
/// outer dimension; `None` on overflow or when it exceeds what a slice may span.
pub(super) fn extent(inner: usize, outer: &[(usize, usize)]) -> Option<usize> {
    let mut end = inner;
    for &(count, stride) in outer {
        end = end.checked_add(count.checked_sub(1)?.checked_mul(stride)?)?;
    }
    (end <= isize::MAX as usize).then_some(end)
}

/// Steps of the exact search in [`disjoint_runs`] beyond which it gives up (a few µs).
pub(super) const SEARCH_STEPS: usize = 1 << 14;

/// Whether the runs `[o, o + inner)` at the offsets `o = i·s + j·t` (`i < e`, `j < f`, with
/// `dims = [(e, s), (f, t)]`) are pairwise disjoint; `None` when that is not decided within
/// [`SEARCH_STEPS`] steps.
///
/// Two runs meet iff their offsets differ by less than `inner`, i.e. iff some `(i, j) ≠ (0, 0)`
/// with `|i| < e`, `|j| < f` has `|i·s + j·t| < inner`. A dimension whose stride is below `inner`
/// meets at its first step; if the larger stride steps over the whole span of the smaller
/// dimension (every contiguous, padded or permuted layout), nothing meets; otherwise, for each
/// `j` of the shorter dimension, `|i·s + j·t|` is convex in `i`, so the nearest `i` (clamped to
/// its range) decides. Sound and complete; only the search is bounded.
pub(super) fn disjoint_runs(inner: usize, dims: [(usize, usize); 2]) -> Option<bool> {
    let inner = inner as u128;
    let [a, b] = dims.map(|(count, stride)| (count as u128, stride as u128));
    let used = |(count, _): (u128, u128)| count > 1;
    if [a, b].into_iter().any(|d| used(d) && d.1 < inner) {
        return Some(false);
    }
    if !(used(a) && used(b)) {
        return Some(true);
    }
    let ((e_small, s_small), (e_big, s_big)) = if a.1 <= b.1 { (a, b) } else { (b, a) };
    if s_big >= (e_small - 1) * s_small + inner {
        return Some(true);
    }
    let ((e_loop, s_loop), (e_free, s_free)) = if e_small <= e_big {
        ((e_small, s_small), (e_big, s_big))
    } else {
        ((e_big, s_big), (e_small, s_small))
    };
    if e_loop - 1 > SEARCH_STEPS as u128 {
        return None;
    }
    let (s_free, lim, inner) = (s_free as i128, e_free as i128 - 1, inner as i128);
    for j in 1..e_loop as i128 {
        let x = j * s_loop as i128;
        let q = x.div_euclid(s_free);
        for i in [-q, -q - 1] {
            if (i.clamp(-lim, lim) * s_free + x).abs() < inner {
                return Some(false);
            }
        }
    }
    Some(true)
}

/// Whether every byte of `[0, extent)` belongs to one of the runs `[o, o + inner)` (offsets as in
/// [`disjoint_runs`]): a contiguous tensor.
pub(super) fn dense(inner: usize, dims: [(usize, usize); 2]) -> bool {
    let [a, b] = dims;
    let by_stride = if a.1 <= b.1 { [a, b] } else { [b, a] };
    let mut span = inner;
    for (count, stride) in by_stride.into_iter().filter(|&(c, _)| c > 1) {
        if stride != span {
            return false;
        }
        span = span.saturating_mul(count);
    }
    true
}

/// One tensor's memory as the overlap checks see it: `[addr, addr + extent)`, made of runs of
/// `inner` bytes (the first at `addr`, the last ending at `addr + extent`).
pub struct Span {
    pub addr: usize,
    pub extent: usize,
    pub inner: usize,
    pub dense: bool,
}

impl Span {
    fn meets(&self, lo: usize, len: usize) -> bool {
        lo < self.addr + self.extent && self.addr < lo + len
    }

    /// The first and the last run: always element bytes.
    fn end_runs(&self) -> [(usize, usize); 2] {
        [
            (self.addr, self.inner),
            (self.addr + self.extent - self.inner, self.inner),
        ]
    }

    /// `Some(true)` when the two tensors certainly share a byte, `Some(false)` when their extents
    /// are apart, `None` when the extents interleave and sharing is not proven. Proofs: an end run
    /// of one meets an end run of the other, or lies in the extent of the other when that one is
    /// dense.
    pub fn shares_bytes(&self, other: &Span) -> Option<bool> {
        if !self.meets(other.addr, other.extent) {
            return Some(false);
        }
        let run_in = |run: (usize, usize), t: &Span| {
            (t.dense && t.meets(run.0, run.1))
                || t.end_runs()
                    .iter()
                    .any(|&(lo, len)| run.0 < lo + len && lo < run.0 + run.1)
        };
        let proven = self.end_runs().iter().any(|&r| run_in(r, other))
            || other.end_runs().iter().any(|&r| run_in(r, self));
        proven.then_some(true)
    }
}
