//! An expert's int8 weights: found in the cache, or inflated now (and cached).

use super::cache::{
    fingerprint, name_hash, Cache, CacheStats, Expert, Key, Lookup, Policy, Segment, Verify,
};
use super::call::try_vec;
use super::desc::Problem;
use super::{Error, ErrorKind};
use crate::inflate::{inflate_expert_with, ExpertWeights, InflateError};
use crate::isa::Isa;
use crate::layout::Tiles;
use crate::npu::{flags, Device};
use std::sync::Arc;

/// The cache and how a hit is verified.
pub(super) struct Experts {
    cache: Cache,
    verify: Verify,
}

/// Where an expert came from.
pub(super) enum Source {
    Cache,
    /// Inflated now: bytes of native B written.
    Inflated(u64),
}

impl Experts {
    pub fn new(budget: u64, policy: Policy, verify: Verify) -> Experts {
        Experts {
            cache: Cache::new(budget, policy),
            verify,
        }
    }

    pub fn stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Expert `e` of `weights` (the whole `as` tensor of `p`, named `name`), inflated on `isa`
    /// into a device buffer of `device` (synced) unless the cache holds it.
    #[allow(clippy::too_many_arguments)]
    pub fn get(
        &self,
        device: &Device,
        tiles: &Tiles,
        isa: Isa,
        p: &Problem,
        weights: &[u8],
        name: Option<&str>,
        e: usize,
    ) -> Result<(Arc<Expert>, Source), Error> {
        let (off, len) = p.expert_bytes(e);
        let bytes = &weights[off..off + len];
        let key = Key {
            addr: weights.as_ptr() as usize + off,
            ty: p.wtype,
            k: p.k,
            n: p.n,
            row_stride: p.w_nb1,
            name_hash: name_hash(name),
        };
        let block = p.wtype.block_bytes();
        let fp = fingerprint(bytes, p.n, p.w_row_bytes, p.w_nb1, block, self.verify);
        if let Lookup::Hit(x) = self.cache.lookup(&key, fp) {
            return Ok((x, Source::Cache));
        }
        let (kp, np) = (tiles.pad(p.k), tiles.pad(p.n));
        let mut b = device.alloc::<i8>(tiles.b_len(kp, np), flags::CPU_FILLED, 0)?;
        let mut chan = try_vec(np, 0f32, "channel scales")?;
        let w = ExpertWeights {
            ty: p.wtype,
            data: bytes,
            row_stride: p.w_nb1,
            n: p.n,
            k: p.k,
        };
        let inflate = |out: &mut [i8], chan: &mut [f32]| {
            inflate_expert_with(isa, &w, tiles, out, chan).map_err(|err| match err {
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
        let mut segments = Vec::with_capacity(depths.len());
        if let [(k0, k1)] = depths[..] {
            inflate(b.as_mut_slice(), &mut chan)?;
            segments.push(Segment {
                k0,
                k1,
                b_offset: 0,
            });
        } else {
            // Deeper than one device GEMM: inflate the whole rows (one scale per channel over all
            // of K), then lay each depth range out as a native B of its own.
            let mut whole = try_vec(tiles.b_len(kp, np), 0i8, "inflated expert")?;
            inflate(&mut whole, &mut chan)?;
            let mut at = 0;
            for (k0, k1) in depths {
                let len = tiles.b_len(k1 - k0, np);
                tiles.copy_b_depth(
                    &whole,
                    kp,
                    np,
                    (k0, k1),
                    &mut b.as_mut_slice()[at..at + len],
                );
                segments.push(Segment {
                    k0,
                    k1,
                    b_offset: at,
                });
                at += len;
            }
        }
        b.sync_to_device()?;
        let written = b.len() as u64;
        let x = Arc::new(Expert { b, chan, segments });
        self.cache.insert(key, fp, Arc::clone(&x));
        Ok((x, Source::Inflated(written)))
    }
}
