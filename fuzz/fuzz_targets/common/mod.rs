//! Reading fuzz input as a sequence of choices.
#![allow(dead_code)]

/// The input, consumed front to back; past its end every choice is 0.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data, pos: 0 }
    }

    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.byte()))
    }

    /// In `0..n` (n > 0): one byte for small `n`, eight otherwise.
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 256 {
            self.byte() as usize % n
        } else {
            (self.u64() % n as u64) as usize
        }
    }

    /// `len` raw bytes (zeros past the end).
    pub fn take(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.byte()).collect()
    }

    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }
}

/// Runs of `inner` bytes at the offsets of a `(count, stride)` lattice, sorted; `None` when there
/// are more than `limit` of them.
pub fn runs(inner: usize, dims: &[(usize, usize)], limit: usize) -> Option<Vec<(usize, usize)>> {
    let count = dims
        .iter()
        .try_fold(1usize, |n, &(c, _)| n.checked_mul(c))?;
    if count > limit {
        return None;
    }
    let mut offsets = vec![0usize];
    for &(c, s) in dims {
        offsets = offsets
            .iter()
            .flat_map(|&o| (0..c).map(move |i| o + i * s))
            .collect();
    }
    let mut r: Vec<(usize, usize)> = offsets.into_iter().map(|o| (o, o + inner)).collect();
    r.sort_unstable();
    Some(r)
}

/// Whether sorted runs overlap one another.
pub fn self_overlap(r: &[(usize, usize)]) -> bool {
    r.windows(2).any(|w| w[1].0 < w[0].1)
}

/// Whether two sets of sorted runs (at bases `a0`, `b0`) share a byte.
pub fn cross_overlap(a0: usize, a: &[(usize, usize)], b0: usize, b: &[(usize, usize)]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = ((a0 + a[i].0, a0 + a[i].1), (b0 + b[j].0, b0 + b[j].1));
        if x.0 < y.1 && y.0 < x.1 {
            return true;
        }
        if x.1 <= y.1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    false
}
