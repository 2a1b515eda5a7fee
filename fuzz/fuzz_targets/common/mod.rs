//! Reading fuzz input as a sequence of choices, and what the targets over whole calls share:
//! descriptors drawn around natural values, and an arena of real memory for their data.
#![allow(dead_code)]

use ork_moe::ffi::{ork_result, ork_tensor, ORK_INVALID_ARGUMENT, ORK_NOT_HANDLED, ORK_OK};
use ork_moe::moe::desc::{Problem, TensorDesc};
use ork_moe::moe::{Error, ErrorKind};

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

/// Bytes of the arena the call targets place their tensors in.
pub const ARENA: usize = 1 << 16;

/// A dimension: mostly `natural`, sometimes empty, negative, huge or batched.
pub fn dim(b: &mut Bytes, natural: i64) -> i64 {
    match b.below(16) {
        0 => [0, -1, i64::MAX, 1 << 40, 2][b.below(5)],
        _ => natural,
    }
}

/// A byte stride: mostly `natural`, sometimes padded, zero, tiny, huge or anything small.
pub fn stride(b: &mut Bytes, natural: usize) -> usize {
    match b.below(16) {
        0 => [0, usize::MAX / 2, 1 << 40, 3, 4][b.below(5)],
        1 => natural.saturating_add(4 * b.below(16)),
        2 => b.below(1 << 10),
        _ => natural,
    }
}

/// A data address: mostly 4-aligned inside the arena at `arena`, sometimes NULL or near the
/// top of the address space.
pub fn addr(b: &mut Bytes, arena: usize) -> usize {
    match b.below(32) {
        0 => 0,
        1 => usize::MAX - b.below(1 << 12),
        _ => arena + 4 * b.below(ARENA / 4),
    }
}

pub fn desc(t: &ork_tensor) -> TensorDesc<'static> {
    TensorDesc {
        ty: t.r#type,
        ne: t.ne,
        nb: t.nb,
        addr: t.data as usize,
        name: None,
    }
}

/// The C code of a validation result (`InvalidArgument` or `NotHandled` only).
pub fn code(v: &Result<Problem, Error>) -> ork_result {
    match v {
        Ok(_) => ORK_OK,
        Err(e) if e.kind == ErrorKind::NotHandled => ORK_NOT_HANDLED,
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
            ORK_INVALID_ARGUMENT
        }
    }
}

/// [`ARENA`] bytes at a 64-aligned address, so that offsets keep their alignment in a copy.
pub struct Arena {
    raw: Vec<u8>,
    base: usize,
}

impl Arena {
    pub fn new(bytes: &[u8]) -> Arena {
        let mut raw = vec![0u8; ARENA + 64];
        let base = (64 - raw.as_ptr() as usize % 64) % 64;
        raw[base..base + ARENA].copy_from_slice(bytes);
        Arena { raw, base }
    }

    pub fn addr(&self) -> usize {
        self.raw.as_ptr() as usize + self.base
    }

    pub fn bytes(&self) -> &[u8] {
        &self.raw[self.base..self.base + ARENA]
    }

    /// Whether `[addr, addr + len)` lies inside.
    pub fn holds(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr()
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= self.addr() + ARENA)
    }

    /// `t` moved from `from`'s arena into this one (NULL and outside stay as they are).
    pub fn moved(&self, from: &Arena, t: &ork_tensor) -> ork_tensor {
        let a = t.data as usize;
        let data = if from.holds(a, 0) {
            (a - from.addr() + self.addr()) as *mut std::ffi::c_void
        } else {
            t.data
        };
        ork_tensor { data, ..*t }
    }
}

/// `ARENA` bytes of a pattern that `seed` varies (random-looking weights and activations, NaN
/// and infinite fp16 scales among them).
pub fn arena_bytes(seed: &[u8]) -> Vec<u8> {
    let seed = if seed.is_empty() { &[0u8][..] } else { seed };
    (0..ARENA)
        .map(|i| seed[i % seed.len()] ^ (i as u8).wrapping_mul(31) ^ (i >> 8) as u8)
        .collect()
}

/// Offsets (from `dst`'s data) of the bytes of `p`'s output elements.
pub fn dst_bytes(p: &Problem) -> impl Iterator<Item = usize> + '_ {
    (0..p.n_tokens).flat_map(move |t| {
        (0..p.n_used).flat_map(move |s| {
            let row = 4 * p.dst_offset(t, s);
            row..row + 4 * p.n
        })
    })
}
