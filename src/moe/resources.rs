//! What the threads of every call, and the prefetch threads, work with: the device and its tile
//! sizes, the host kernels' path, the experts (cache and staging area), the spare buffers and
//! the engine's counters.

use super::call::{Call, Prepared};
use super::dispatch::{Memory, Table};
use super::expert::Experts;
use super::scatter::QUAD;
use super::spares::Spares;
use super::stats::Counters;
use super::{Config, Error, ErrorKind};
use crate::isa::Isa;
use crate::layout::Tiles;
use crate::npu::{CoreMask, Device};
use std::sync::Arc;

/// The RK3588's A tile width, fixed so that row pieces are constant-sized (inlined copies);
/// [`device_tiles`] checks the device's, and its C quad against [`QUAD`].
pub(super) const A_K: usize = 16;

/// The device's tile sizes, if the engine's kernels take them.
pub(super) fn device_tiles(device: &Device) -> Result<Tiles, Error> {
    let tiles = device.tiles();
    if tiles.a_k != A_K || tiles.c_n != QUAD || !tiles.b_n.is_multiple_of(QUAD) || tiles.b_k != 32 {
        return Err(Error::new(
            ErrorKind::DeviceError,
            format!("unsupported tile sizes {tiles:?}"),
        ));
    }
    Ok(tiles)
}

/// An engine's own state beside its calls and its prefetch threads (which share it).
pub(super) struct Resources {
    pub config: Config,
    pub device: Device,
    pub tiles: Tiles,
    /// Kernel path of the host-side kernels (inflate, scatter, the CPU GEMMs).
    pub isa: Isa,
    pub experts: Experts,
    pub counters: Counters,
    /// Which calls are taken (`ORK_DISPATCH`), and what their classes measured.
    pub dispatch: Table,
    pub spare_a: Spares<i8>,
    pub spare_b: Spares<i8>,
    pub spare_c: Spares<i32>,
}

impl Resources {
    /// The resources of an engine on `device` (of [`device_tiles`]), whose prefetch threads may
    /// stage up to `staged` bytes of experts (0 without prefetch threads).
    pub fn new(config: Config, device: Device, tiles: Tiles, staged: usize) -> Resources {
        let experts = Experts::new(
            config.cache_bytes,
            config.cache_policy,
            config.cache_verify,
            staged as u64,
        );
        Resources {
            dispatch: Table::new(config.dispatch, Memory::of(&config, &device)),
            experts,
            isa: config.device.host.isa,
            config,
            device,
            tiles,
            counters: Counters::default(),
            spare_a: Spares::new(256, 128 << 20),
            // Enough for the streamed experts of a few calls (a 2048x768 expert is 1.5 MiB), and
            // with prefetch for the staged ones too, which would otherwise be created again every
            // graph (milliseconds each on the board).
            spare_b: Spares::new(256 + (staged >> 20), (256 << 20) + staged),
            spare_c: Spares::new(256, 128 << 20),
        }
    }

    /// Threads of the single-caller entry point: the pool's, capped by the configuration.
    pub fn threads(&self) -> usize {
        self.config
            .device
            .host
            .threads
            .clamp(1, crate::pool::global().threads())
    }

    /// The NPU cores submitter threads run on (one thread each; empty: the caller's threads run
    /// the GEMMs themselves). `Config::submitters`, by default one per enabled core when the
    /// device offloads its runs (the threads wait for the NPU without using a core), else none.
    pub fn submitter_cores(&self) -> Vec<CoreMask> {
        let cores = self.device.core_mask().cores();
        let n = match self.config.submitters {
            Some(n) => n,
            None if self.device.offloads() => cores.len(),
            None => 0,
        };
        (0..n)
            .map(|i| CoreMask(1 << cores[i % cores.len()]))
            .collect()
    }

    /// Returns what a finished call still holds to the spares.
    pub fn recycle(&self, call: Call) {
        for p in call.into_prepared() {
            self.recycle_prepared(p);
        }
    }

    /// Returns a prepared expert's A buffer to the spares, and its B buffer if nothing holds it
    /// any more (not kept by the cache, or evicted since).
    pub fn recycle_prepared(&self, p: Prepared) {
        self.spare_a.give(p.a);
        if let Ok(expert) = Arc::try_unwrap(p.expert) {
            self.spare_b.give(expert.b);
        }
    }
}
