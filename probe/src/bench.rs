//! The A3B expert shapes, and the timing the measuring subcommands share.

use std::ops::{Deref, DerefMut};
use std::time::Instant;

/// (K, N, role) of the Qwen3 A3B expert GEMMs: gate/up and down of two model sizes.
pub const A3B_SHAPES: [(usize, usize, &str); 4] = [
    (2048, 768, "gate/up"),
    (768, 2048, "down"),
    (4096, 1408, "gate/up (wide)"),
    (1408, 4096, "down (wide)"),
];

/// The role of an A3B shape ("gate/up", "down", ...), or "custom".
pub fn role(k: usize, n: usize) -> &'static str {
    A3B_SHAPES
        .iter()
        .find(|s| (s.0, s.1) == (k, n))
        .map_or("custom", |s| s.2)
}

/// Median and spread of repeated timings, in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// Runs `f` `warmup` times untimed, then `repeats` times timed; returns the median and spread.
pub fn time<F: FnMut()>(warmup: usize, repeats: usize, mut f: F) -> Timing {
    for _ in 0..warmup {
        f();
    }
    let t: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    Timing::of(t)
}

impl Timing {
    /// Median and spread of `seconds` (at least one).
    pub fn of(mut seconds: Vec<f64>) -> Timing {
        seconds.sort_by(f64::total_cmp);
        Timing {
            median: seconds[seconds.len() / 2],
            min: seconds[0],
            max: seconds[seconds.len() - 1],
        }
    }
}

/// A zeroed int8 buffer that starts on a 64-byte cache line, as the NPU buffers the library
/// inflates into do (page-aligned dma-bufs). A large `Vec` starts 16 bytes into its page, which
/// splits every other 32- or 64-byte store across two lines and slowed the AVX-512 inflate by up
/// to a third.
pub struct LineAligned {
    buf: Vec<i8>,
    at: usize,
    len: usize,
}

impl LineAligned {
    pub fn zeroed(len: usize) -> LineAligned {
        let buf = vec![0i8; len + 63];
        let at = buf.as_ptr().align_offset(64);
        LineAligned { buf, at, len }
    }
}

impl Deref for LineAligned {
    type Target = [i8];
    fn deref(&self) -> &[i8] {
        &self.buf[self.at..self.at + self.len]
    }
}

impl DerefMut for LineAligned {
    fn deref_mut(&mut self) -> &mut [i8] {
        &mut self.buf[self.at..self.at + self.len]
    }
}
