//! An expert's int8 weights: found in the cache, or inflated now (and cached), from plain blocks
//! or from the ggml-cpu repack the call names ([`crate::inflate::inflate_expert_in_with`]).
//!
//! A call computes one projection, or a pair sharing activations and ids (gate and up: one GEMM
//! per expert over both). The weights of a pair are inflated into one native B, the first
//! projection's N-tiles then the second's, so that one submit computes both.

use super::cache::{
    fingerprint, name_hash, Cache, CacheStats, Expert, Fingerprint, Key, Lookup, Policy, Segment,
    Verify,
};
use super::desc::Problem;
use super::spares::Spares;
use super::staging::Staging;
use super::{try_vec, Error, ErrorKind};
use crate::inflate::{inflate_expert_in_with, ExpertWeights, InflateError};
use crate::isa::Isa;
use crate::layout::Tiles;
use crate::npu::Device;
use std::sync::Arc;

/// The cache and how a hit is verified.
pub(super) struct Experts {
    cache: Cache,
    verify: Verify,
    staging: Arc<Staging>,
}

/// Where an expert came from.
pub(super) enum Source {
    Cache,
    /// Inflated now: bytes of native B written.
    Inflated(u64),
    /// Inflated ahead by the prefetch threads (`super::prefetch`): bytes of native B.
    Prefetched(u64),
}

/// Expert `e`'s bytes in one projection, rows `row_stride` apart (a pair's projections share
/// type and shape, not necessarily their strides).
struct Part<'a> {
    bytes: &'a [u8],
    row_stride: usize,
}

/// One projection's weights: the whole `as` tensor of `problem`, and its name.
#[derive(Clone, Copy)]
pub(super) struct Weights<'a> {
    pub problem: &'a Problem,
    pub data: &'a [u8],
    pub name: Option<&'a str>,
}

impl<'a> Weights<'a> {
    /// Expert `e`'s bytes, and its cache identity.
    fn expert(&self, e: usize, verify: Verify) -> (&'a [u8], Key, Fingerprint) {
        let p = self.problem;
        let (off, len) = p.expert_bytes(e);
        let bytes = &self.data[off..off + len];
        let key = Key {
            addr: self.data.as_ptr() as usize + off,
            ty: p.wtype,
            layout: p.layout,
            k: p.k,
            n: p.n,
            row_stride: p.w_nb1,
            name_hash: name_hash(self.name),
            pair: 0,
        };
        let fp = fingerprint(
            bytes,
            p.n,
            p.w_row_bytes,
            p.w_nb1,
            p.wtype.block_bytes(),
            verify,
        );
        (bytes, key, fp)
    }
}

impl Experts {
    pub fn new(budget: u64, policy: Policy, verify: Verify, staging_budget: u64) -> Experts {
        Experts {
            cache: Cache::new(budget, policy),
            verify,
            staging: Arc::new(Staging::new(staging_budget)),
        }
    }

    pub fn stats(&self) -> CacheStats {
        self.cache.stats()
    }

    pub fn staging(&self) -> &Arc<Staging> {
        &self.staging
    }

    /// Expert `e` of the projections `weights` (one, or a pair of one shape), inflated on `isa`
    /// into one device buffer of `device` (synced) unless the cache holds it or the prefetch
    /// staged it.
    pub fn get(
        &self,
        device: &Device,
        spares: &Spares<i8>,
        tiles: &Tiles,
        isa: Isa,
        weights: &[Weights],
        e: usize,
    ) -> Result<(Arc<Expert>, Source), Error> {
        let (parts, key, fp) = self.identity(weights, e);
        if let Lookup::Hit(x) = self.cache.lookup(&key, fp) {
            return Ok((x, Source::Cache));
        }
        // The one expert of its call (a dense matmul): nothing overlaps its inflate.
        let priority = weights[0].problem.one_expert();
        if let Some(x) = self.staging.take(&key, fp) {
            self.cache.insert(key, fp, Arc::clone(&x), priority);
            let p = weights[0].problem;
            let written = tiles.b_len(tiles.pad(p.k), tiles.pad(p.n) * weights.len());
            return Ok((x, Source::Prefetched(written as u64)));
        }
        let (x, written) = self.make(device, spares, tiles, isa, weights[0].problem, &parts, e)?;
        let x = Arc::new(x);
        self.cache.insert(key, fp, Arc::clone(&x), priority);
        Ok((x, Source::Inflated(written)))
    }

    /// [`Experts::get`]'s inflate for the prefetch: expert `e` into the staging area, unless the
    /// cache holds it, it is staged or being made already, or its call has started.
    pub fn prefetch(
        &self,
        device: &Device,
        spares: &Spares<i8>,
        tiles: &Tiles,
        isa: Isa,
        weights: &[Weights],
        e: usize,
    ) -> Result<(), Error> {
        let (parts, key, fp) = self.identity(weights, e);
        if self.cache.holds(&key, fp) {
            return Ok(());
        }
        let addr = weights[0].data.as_ptr() as usize;
        let Some(claim) = self.staging.claim(key, fp, addr) else {
            return Ok(());
        };
        let (x, _) = self.make(device, spares, tiles, isa, weights[0].problem, &parts, e)?;
        claim.stage(Arc::new(x));
        Ok(())
    }

    /// The bytes of expert `e` in each projection with their row stride, and the cache
    /// identity of all of them.
    fn identity<'w>(&self, weights: &[Weights<'w>], e: usize) -> (Vec<Part<'w>>, Key, Fingerprint) {
        let parts: Vec<_> = weights.iter().map(|w| w.expert(e, self.verify)).collect();
        let (_, mut key, mut fp) = parts[0];
        if let Some(&(_, second, second_fp)) = parts.get(1) {
            key.pair = second.addr ^ second.name_hash as usize;
            fp = fp.with(second_fp);
        }
        let parts = parts
            .into_iter()
            .zip(weights)
            .map(|((bytes, ..), w)| Part {
                bytes,
                row_stride: w.problem.w_nb1,
            })
            .collect();
        (parts, key, fp)
    }

    /// Inflates expert `e` of the projections' bytes `parts` (of `p`'s shape) into one native B,
    /// synced to the device; also the bytes of B written.
    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        device: &Device,
        spares: &Spares<i8>,
        tiles: &Tiles,
        isa: Isa,
        p: &Problem,
        parts: &[Part],
        e: usize,
    ) -> Result<(Expert, u64), Error> {
        let (kp, np) = (tiles.pad(p.k), tiles.pad(p.n));
        let n_all = np * parts.len();
        // A spare may be longer than asked: everything reads B through `segments`.
        let b_len = tiles.b_len(kp, n_all);
        let mut b = spares.take(device, b_len)?;
        let mut chan = try_vec(n_all, 0f32, "channel scales")?;
        let inflate = |part: &Part, out: &mut [i8], chan: &mut [f32]| {
            let w = ExpertWeights {
                ty: p.wtype,
                data: part.bytes,
                row_stride: part.row_stride,
                n: p.n,
                k: p.k,
            };
            inflate_expert_in_with(isa, p.layout, &w, tiles, out, chan).map_err(|err| match err {
                InflateError::NonFiniteScale { row, block } => Error::new(
                    ErrorKind::InvalidArgument,
                    format!("as: expert {e}, row {row}, block {block} has a NaN or infinite scale"),
                ),
                other => Error::new(
                    ErrorKind::Internal,
                    format!("inflating expert {e}: {other}"),
                ),
            })
        };
        let depths = tiles.k_segments(kp, device.max_k());
        let one = tiles.b_len(kp, np);
        let segments = if let [(k0, k1)] = depths[..] {
            // One native B over all projections: their N-tiles back to back.
            let outs = b.as_mut_slice()[..one * parts.len()].chunks_exact_mut(one);
            for ((part, out), chan) in parts.iter().zip(outs).zip(chan.chunks_exact_mut(np)) {
                inflate(part, out, chan)?;
            }
            vec![Segment {
                k0,
                k1,
                b_offset: 0,
            }]
        } else {
            // Deeper than one device GEMM: inflate the whole rows (one scale per channel over all
            // of K), then lay each depth range out as a native B of its own, projections back to
            // back.
            let mut whole = try_vec(one * parts.len(), 0i8, "inflated expert")?;
            let outs = whole.chunks_exact_mut(one);
            for ((part, out), chan) in parts.iter().zip(outs).zip(chan.chunks_exact_mut(np)) {
                inflate(part, out, chan)?;
            }
            let mut segments = Vec::with_capacity(depths.len());
            let mut at = 0;
            for (k0, k1) in depths {
                segments.push(Segment {
                    k0,
                    k1,
                    b_offset: at,
                });
                let len = tiles.b_len(k1 - k0, np);
                for src in whole.chunks_exact(one) {
                    let out = &mut b.as_mut_slice()[at..at + len];
                    tiles.copy_b_depth(src, kp, np, (k0, k1), out);
                    at += len;
                }
            }
            segments
        };
        b.sync_to_device()?;
        Ok((Expert { b, chan, segments }, b_len as u64))
    }
}
