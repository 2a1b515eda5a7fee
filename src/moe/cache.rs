//! The expert cache: inflated experts (native int8 B in a device buffer + channel scales), kept
//! under a byte budget.
//!
//! # Which experts stay
//! At real scale the experts a model uses in one forward pass far exceed any budget (Qwen3-30B-A3B:
//! 6144 experts, 9.7 GB as int8), and a prefill ubatch touches every one of them once, in the same
//! order every time: a cyclic sweep. LRU then hits nothing (each entry is evicted just before its
//! next use). [`Policy::Pin`] (the default) keeps what fits and streams the rest: once the budget
//! is full, a new expert is used by its call and dropped, unless some entry has gone *stale* — not
//! used for twice the reuse distance the cache observes on its hits (a model unloaded, a sweep
//! that moved on) — and then it replaces the stalest one. A sweep of W experts over a budget of C
//! thus hits C/W of the time, and a working set that fits is held whole as with LRU.
//! [`Policy::Lru`] is kept for comparison (`ORK_CACHE_POLICY=lru`).
//!
//! Under `Pin` a *priority* entry (the one expert of its call: a dense matmul's weights) may also
//! take the place of the least recently used ordinary entry. A routed call inflates one expert
//! while the NPU runs others, but nothing in a call of one expert overlaps its inflate, which then
//! delays the whole forward pass; and a prefill uses each of those matrices every ubatch.
//!
//! # Keying, and why stale tiles are not served
//! An entry is found by [`Key`]: the address of the expert's first weight byte, the weight type,
//! K, N, the row stride and a hash of the tensor's name. A hit also needs the entry's
//! [`Fingerprint`] to match the expert's current bytes, so memory reused for other weights (a
//! model unloaded and another loaded at the same address, same shape and name) is detected and
//! re-inflated rather than served from stale tiles.
//!
//! The fingerprint is a trade-off, chosen by [`Verify`]:
//! - `Sampled` (default): a 64-bit hash of 17 blocks spread over the expert (first block, 15 spread
//!   over the rows and columns, last block), a few KiB per lookup. Any reload of different weights
//!   changes the sampled blocks' scales with near certainty; what it can miss is an in-place edit
//!   that touches only unsampled blocks (e.g. patching a handful of rows).
//! - `Full`: a hash of every byte of the expert: sound against any edit, but it reads the whole
//!   quantized expert on every hit (for Q4_0 2048×768, 864 KiB), a cost comparable to a good part of
//!   inflating it.

use crate::inflate::Layout;
use crate::npu::Buffer;
use crate::quant::GgmlType;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// How much of an expert's bytes a cache hit re-checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    Sampled,
    Full,
}

/// What the cache does when a new expert does not fit (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Keep what is held; replace only stale entries.
    Pin,
    /// Evict least recently used first.
    Lru,
}

/// Identity of one expert's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub addr: usize,
    pub ty: GgmlType,
    /// The same bytes read in another layout are other weights.
    pub layout: Layout,
    pub k: usize,
    pub n: usize,
    pub row_stride: usize,
    pub name_hash: u64,
    /// For the two projections of a pair inflated together: the second one's identity (its
    /// address mixed with its name hash); 0 for a single projection.
    pub pair: usize,
}

/// Hash of (some of) an expert's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint(u64);

impl Fingerprint {
    /// The fingerprint of two experts kept as one entry. Both are hashed as data: with one of
    /// them as the seed, two equal fingerprints (a pair whose projections are one tensor) would
    /// cancel to 0 whatever the bytes, and a stale entry would match.
    pub fn with(self, other: Fingerprint) -> Fingerprint {
        let first = hash_bytes(FNV_OFFSET, &self.0.to_le_bytes());
        Fingerprint(hash_bytes(first, &other.0.to_le_bytes()))
    }
}

/// A 64-bit FNV-1a variant working on 8-byte words (tail bytes one by one); not cryptographic,
/// only a change detector.
pub fn hash_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(PRIME);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(PRIME);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Hash of a tensor name (0 for none).
pub fn name_hash(name: Option<&str>) -> u64 {
    name.map_or(0, |s| hash_bytes(FNV_OFFSET, s.as_bytes()))
}

/// Fingerprint of an expert whose `n` rows of `row_bytes` start every `row_stride` bytes of `w`.
pub fn fingerprint(
    w: &[u8],
    n: usize,
    row_bytes: usize,
    row_stride: usize,
    block_bytes: usize,
    verify: Verify,
) -> Fingerprint {
    let mut h = FNV_OFFSET;
    let row = |r: usize| &w[r * row_stride..r * row_stride + row_bytes];
    match verify {
        Verify::Full => {
            for r in 0..n {
                h = hash_bytes(h, row(r));
            }
        }
        Verify::Sampled => {
            const SPREAD: usize = 15;
            let blocks = row_bytes / block_bytes;
            let block = |r: usize, i: usize| &row(r)[i * block_bytes..(i + 1) * block_bytes];
            h = hash_bytes(h, block(0, 0));
            for s in 0..SPREAD {
                let r = (s * n + n / 2) / SPREAD;
                h = hash_bytes(h, block(r.min(n - 1), (s * 7 + 3) % blocks));
            }
            h = hash_bytes(h, block(n - 1, blocks - 1));
        }
    }
    Fingerprint(h)
}

/// One inflated expert: native int8 B (synced to the device) and one scale per channel (`np`
/// long; padding channels 0).
///
/// B is one native `kp × np` matrix, or, for a depth beyond what one device GEMM takes, one
/// native matrix per depth segment, back to back: segment `s` covers depth `segments[s].k0..k1`
/// at element `segments[s].b_offset`. Either way the int8 values are those of inflating the whole
/// row (one scale per channel over all of K), so the segments' int32 products sum to the full one.
pub struct Expert {
    pub b: Buffer<i8>,
    pub chan: Vec<f32>,
    pub segments: Vec<Segment>,
}

/// A depth range of an [`Expert`]'s B.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub k0: usize,
    pub k1: usize,
    /// Where this segment's native B starts in `Expert::b`.
    pub b_offset: usize,
}

impl Expert {
    /// Bytes the entry holds against the budget.
    pub fn bytes(&self) -> u64 {
        (self.b.len() + 4 * self.chan.len()) as u64
    }
}

struct Slot {
    expert: Arc<Expert>,
    fingerprint: Fingerprint,
    /// Tick (lookups and inserts) of the last use.
    last_used: u64,
    /// A priority entry (module docs).
    priority: bool,
}

/// What a lookup found.
pub enum Lookup {
    Hit(Arc<Expert>),
    /// Not present, or present with other bytes (then the stale entry is already dropped).
    Miss,
}

/// Cache counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Experts not stored because the budget was full of entries worth keeping ([`Policy::Pin`]).
    pub bypassed: u64,
    /// Bytes held now.
    pub bytes: u64,
}

/// The running totals as a log line shows them (`ggml-patch/realscale.sh` reads them back).
impl std::fmt::Display for CacheStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cache hits {} misses {} evictions {} bypassed {} held {} MiB",
            self.hits,
            self.misses,
            self.evictions,
            self.bypassed,
            self.bytes >> 20
        )
    }
}

struct Inner {
    map: HashMap<Key, Slot>,
    tick: u64,
    /// The reuse distance hits show (ticks between two uses of an entry), the largest one seen,
    /// decaying by 1/16 a hit so that it follows a workload that changes; 0 before the first hit.
    reuse: u64,
    stats: CacheStats,
}

/// The cache. Entries are shared (`Arc`): one evicted while a call still uses it is freed when
/// that call drops it, so memory may exceed the budget by the experts of the calls in flight.
pub struct Cache {
    budget: u64,
    policy: Policy,
    inner: Mutex<Inner>,
}

impl Cache {
    pub fn new(budget: u64, policy: Policy) -> Cache {
        Cache {
            budget,
            policy,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                tick: 0,
                reuse: 0,
                stats: CacheStats::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    pub fn lookup(&self, key: &Key, fingerprint: Fingerprint) -> Lookup {
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        match g.map.get_mut(key) {
            Some(slot) if slot.fingerprint == fingerprint => {
                let interval = tick - slot.last_used;
                slot.last_used = tick;
                let e = Arc::clone(&slot.expert);
                g.reuse = (g.reuse - g.reuse / 16).max(interval);
                g.stats.hits += 1;
                Lookup::Hit(e)
            }
            Some(_) => {
                let stale = g.map.remove(key).expect("present");
                g.stats.bytes -= stale.expert.bytes();
                g.stats.evictions += 1;
                g.stats.misses += 1;
                Lookup::Miss
            }
            None => {
                g.stats.misses += 1;
                Lookup::Miss
            }
        }
    }

    /// Whether `key` is held with this fingerprint; neither a use nor a lookup in the counters.
    pub fn holds(&self, key: &Key, fingerprint: Fingerprint) -> bool {
        self.lock()
            .map
            .get(key)
            .is_some_and(|s| s.fingerprint == fingerprint)
    }

    /// Stores `expert` under `key` if the policy makes room for it within the budget, as a
    /// `priority` entry or not (module docs). An expert larger than the whole budget is not stored.
    pub fn insert(&self, key: Key, fingerprint: Fingerprint, expert: Arc<Expert>, priority: bool) {
        let size = expert.bytes();
        if size > self.budget {
            return;
        }
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        if let Some(old) = g.map.remove(&key) {
            g.stats.bytes -= old.expert.bytes();
        }
        while g.stats.bytes + size > self.budget {
            let least_recent = |ordinary_only: bool| {
                g.map
                    .iter()
                    .filter(|(_, s)| !(ordinary_only && s.priority))
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(k, s)| (*k, tick - s.last_used))
            };
            let Some((mut victim, idle)) = least_recent(false) else {
                break;
            };
            // Stale: unused for twice the reuse distance hits show (never, before the first hit).
            let stale = g.reuse > 0 && idle > 2 * g.reuse;
            if self.policy == Policy::Pin && !stale {
                match least_recent(true) {
                    Some((ordinary, _)) if priority => victim = ordinary,
                    _ => {
                        g.stats.bypassed += 1;
                        return;
                    }
                }
            }
            let old = g.map.remove(&victim).expect("present");
            g.stats.bytes -= old.expert.bytes();
            g.stats.evictions += 1;
        }
        g.stats.bytes += size;
        g.map.insert(
            key,
            Slot {
                expert,
                fingerprint,
                last_used: tick,
                priority,
            },
        );
    }

    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npu::{flags, Device};

    #[test]
    fn a_pair_fingerprint_depends_on_both_experts_bytes() {
        let fp = |bytes: &[u8]| fingerprint(bytes, 1, bytes.len(), bytes.len(), 2, Verify::Full);
        let (a, b) = (fp(&[1; 18]), fp(&[2; 18]));
        // One tensor as both projections, its bytes changed: a stale entry must not match.
        assert_ne!(a.with(a), b.with(b));
        assert_ne!(a.with(b), b.with(a));
        assert_ne!(a.with(b), a.with(a));
    }

    fn expert(dev: &Device, len: usize) -> Arc<Expert> {
        Arc::new(Expert {
            b: dev.alloc::<i8>(len, flags::CPU_FILLED, 0).unwrap(),
            chan: vec![1.0; 32],
            segments: Vec::new(),
        })
    }

    fn key(addr: usize) -> Key {
        Key {
            addr,
            ty: GgmlType::Q4_0,
            layout: Layout::Plain,
            k: 32,
            n: 32,
            row_stride: 18,
            name_hash: name_hash(Some("w")),
            pair: 0,
        }
    }

    #[test]
    fn lru_eviction_under_budget() {
        let dev = Device::cpu();
        let per = 1024 + 128;
        let cache = Cache::new(3 * per as u64, Policy::Lru);
        let fp = Fingerprint(1);
        for a in 0..3 {
            cache.insert(key(a), fp, expert(&dev, 1024), false);
        }
        assert!(matches!(cache.lookup(&key(0), fp), Lookup::Hit(_))); // 0 is now the most recent
        cache.insert(key(3), fp, expert(&dev, 1024), false); // evicts 1
        assert!(matches!(cache.lookup(&key(1), fp), Lookup::Miss));
        for a in [0, 2, 3] {
            assert!(matches!(cache.lookup(&key(a), fp), Lookup::Hit(_)), "{a}");
        }
        let s = cache.stats();
        assert_eq!(
            (s.hits, s.misses, s.evictions, s.bytes),
            (4, 1, 1, 3 * per as u64)
        );
        cache.insert(key(9), fp, expert(&dev, 4 * per), false); // larger than the budget: not stored
        assert_eq!(cache.len(), 3);
    }

    /// Hits over `sweeps` passes over experts `first..first + width`, in order, inserting misses
    /// (those from `priority..` as priority entries).
    fn sweep_with(
        cache: &Cache,
        dev: &Device,
        (first, width, priority): (usize, usize, usize),
        sweeps: usize,
    ) -> u64 {
        let before = cache.stats().hits;
        for _ in 0..sweeps {
            for a in first..first + width {
                if let Lookup::Miss = cache.lookup(&key(a), Fingerprint(1)) {
                    cache.insert(key(a), Fingerprint(1), expert(dev, 1024), a >= priority);
                }
            }
        }
        cache.stats().hits - before
    }

    fn sweep(cache: &Cache, dev: &Device, first: usize, width: usize, sweeps: usize) -> u64 {
        sweep_with(cache, dev, (first, width, usize::MAX), sweeps)
    }

    #[test]
    fn priority_entries_take_the_place_of_ordinary_ones_under_pin() {
        let dev = Device::cpu();
        let per = (1024 + 128) as u64;
        // A sweep of 25 experts whose last 5 are priority entries (a dense call's matrices,
        // used after the routed experts), over a budget of 10.
        let pin = Cache::new(10 * per, Policy::Pin);
        let hits = sweep_with(&pin, &dev, (0, 25, 20), 8);
        // Every later sweep hits the 5 priority entries and the 5 ordinary ones still held.
        assert_eq!(hits, 7 * 10);
        for a in 20..25 {
            assert!(
                matches!(pin.lookup(&key(a), Fingerprint(1)), Lookup::Hit(_)),
                "{a}"
            );
        }
        // Ordinary entries never push out a priority one that is in use.
        assert_eq!(pin.stats().evictions, 5);
        // Under LRU priority changes nothing: the sweep hits nothing.
        let lru = Cache::new(10 * per, Policy::Lru);
        assert_eq!(sweep_with(&lru, &dev, (0, 25, 20), 8), 0);
    }

    #[test]
    fn a_cyclic_sweep_larger_than_the_budget_hits_what_fits_under_pin_and_nothing_under_lru() {
        let dev = Device::cpu();
        let per = (1024 + 128) as u64;
        let (fits, width, sweeps) = (10, 25, 8);
        let lru = Cache::new(fits * per, Policy::Lru);
        assert_eq!(sweep(&lru, &dev, 0, width, sweeps), 0);
        let pin = Cache::new(fits * per, Policy::Pin);
        // The first sweep fills the budget; every later one hits the `fits` entries held.
        assert_eq!(
            sweep(&pin, &dev, 0, width, sweeps),
            (sweeps as u64 - 1) * fits
        );
        assert_eq!(pin.stats().evictions, 0);
        assert_eq!(pin.stats().bytes, fits * per);
    }

    #[test]
    fn pinned_entries_give_way_once_the_sweep_moved_on() {
        let dev = Device::cpu();
        let per = (1024 + 128) as u64;
        let pin = Cache::new(10 * per, Policy::Pin);
        sweep(&pin, &dev, 0, 25, 4);
        // Another model's experts: the old entries go stale after two reuse distances, then the
        // new sweep takes their place and hits.
        let hits = sweep(&pin, &dev, 1000, 25, 8);
        assert!(pin.stats().evictions >= 10, "{:?}", pin.stats());
        assert!(hits >= 4 * 10, "{hits} hits on the new sweep");
        assert!(matches!(pin.lookup(&key(0), Fingerprint(1)), Lookup::Miss));
    }

    #[test]
    fn changed_bytes_are_a_miss() {
        let dev = Device::cpu();
        let cache = Cache::new(1 << 20, Policy::Pin);
        let (n, row) = (64usize, 8 * 18usize);
        let mut w: Vec<u8> = (0..n * row).map(|i| (i * 31 % 251) as u8).collect();
        for verify in [Verify::Sampled, Verify::Full] {
            let fp = fingerprint(&w, n, row, row, 18, verify);
            cache.insert(key(7), fp, expert(&dev, 64), false);
            assert!(matches!(
                cache.lookup(&key(7), fingerprint(&w, n, row, row, 18, verify)),
                Lookup::Hit(_)
            ));
            w[0] ^= 1; // the first block is always sampled
            assert!(matches!(
                cache.lookup(&key(7), fingerprint(&w, n, row, row, 18, verify)),
                Lookup::Miss
            ));
            w[0] ^= 1;
        }
        // Only the full hash sees an edit in a block the sample skips.
        let fp = fingerprint(&w, n, row, row, 18, Verify::Sampled);
        let mut edited = w.clone();
        edited[row + 18] ^= 0x10; // row 1, block 1
        assert_eq!(fingerprint(&edited, n, row, row, 18, Verify::Sampled), fp);
        assert_ne!(
            fingerprint(&edited, n, row, row, 18, Verify::Full),
            fingerprint(&w, n, row, row, 18, Verify::Full)
        );
    }
}
