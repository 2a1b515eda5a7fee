//! What the builder keeps across calls: the backend's matmul contexts (carried across ubatches
//! too), and device bytes held first in, first out (the expert cache's occupancy, the prefetch
//! ring).

use std::collections::{HashSet, VecDeque};

/// The rknn backend's matmul contexts: created on first use of a key, kept in a cache that
/// drops the unused ones when full (`src/npu/rknn`). Carried across ubatches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContextCache {
    keys: HashSet<(u32, u32, u32, u8)>,
    /// Contexts created so far.
    pub created: u64,
}

impl ContextCache {
    /// Uses the context of `key` (M, K, N, core) from a cache of `capacity`; true when it had
    /// to be created.
    pub(super) fn get(&mut self, key: (u32, u32, u32, u8), capacity: usize) -> bool {
        if self.keys.contains(&key) {
            return false;
        }
        if self.keys.len() >= capacity {
            // Between calls no context is in use: the backend's retain drops them all.
            self.keys.clear();
        }
        self.keys.insert(key);
        self.created += 1;
        true
    }
}

/// Device bytes held in first-in, first-out order: the expert cache under a streaming sweep (for
/// the occupancy count only), or the prefetch ring. Each entry remembers the task after which its bytes may be reused.
pub(super) struct Fifo {
    capacity: u64,
    held: u64,
    entries: VecDeque<(u64, u32)>,
}

impl Fifo {
    pub(super) fn new(capacity: u64) -> Fifo {
        Fifo {
            capacity,
            held: 0,
            entries: VecDeque::new(),
        }
    }

    /// Takes `bytes`, first letting the oldest entries go: returns (their bytes, their
    /// release tasks).
    pub(super) fn take(&mut self, bytes: u64) -> (u64, Vec<u32>) {
        let (mut freed, mut releases) = (0, Vec::new());
        while self.held + bytes > self.capacity {
            let Some((b, release)) = self.entries.pop_front() else {
                break;
            };
            self.held -= b;
            freed += b;
            releases.push(release);
        }
        (freed, releases)
    }

    /// Holds `bytes` until `release` ended.
    pub(super) fn hold(&mut self, bytes: u64, release: u32) {
        self.held += bytes;
        self.entries.push_back((bytes, release));
    }
}
