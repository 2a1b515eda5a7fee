//! An emulated buffer's memory: the CPU's view and, for a CACHEABLE buffer, the device's, kept
//! apart only while they differ.

use super::faults::FaultOp;
use super::shared::Shared;
use crate::npu::error::{Error, Result};
use crate::npu::storage::{Lines, Storage};
use std::any::Any;
use std::ops::Range;
use std::sync::Arc;

/// An emulated buffer: the CPU's view and, while a CACHEABLE buffer's two sides differ, the
/// device's own view.
///
/// The device view exists only while it differs from the CPU's: CPU writes to a synced buffer
/// first set the old contents aside as the device view, a sync to the device drops it, a submit
/// writing the buffer gets its own view, and a sync from the device makes that view the CPU's.
/// So a synced weight buffer costs its size once, and syncs move no bytes.
///
/// A strict buffer does not set the old contents aside when the CPU writes: a submit refuses
/// its unflushed input, so nothing reads them. A submit writing it, or a sync from the device,
/// before the CPU's writes are flushed takes the CPU's contents for the device memory's old ones
/// (the board would show those; only the bytes the submit did not write differ). Rewriting a
/// recycled weight buffer then costs no copy of its old weights.
///
/// A view that stops being needed is kept as the next split's vector, with a bound on where it
/// differs from the CPU's, so that a recycled output buffer costs neither fresh pages nor a copy
/// of what the submit overwrites: only the bytes that differ and that the submit leaves alone are
/// copied (at real scale fresh pages and whole-buffer copies would take a quarter of the host's
/// time per ubatch, docs/PERFORMANCE.md). A buffer whose views once parted (a submit wrote it,
/// or a lenient buffer's CPU rewrote it) so holds two vectors of its length from then on, as the
/// board holds its device memory besides the CPU's cached view.
pub struct EmuStorage<T> {
    cpu: Lines<T>,
    /// What the NPU sees when it differs from `cpu` (always None when non-cacheable).
    dev: Option<Lines<T>>,
    /// The last retired view (empty if none), reused by the next split.
    spare: Lines<T>,
    /// Elements outside this range are equal in `cpu` and in `dev` (or, without a device view,
    /// `spare`); None: no such bound is known.
    differs: Option<Range<usize>>,
    cacheable: bool,
    strict: bool,
    /// Neither side has written since allocation: both views are zero.
    fresh: bool,
    /// The CPU wrote since the last sync to the device.
    cpu_dirty: bool,
    /// The device wrote since the last sync from the device.
    dev_newer: bool,
    domain: u32,
    pages: u64,
    shared: Arc<Shared>,
}

impl<T: Copy + Default + Send + Sync + 'static> EmuStorage<T> {
    /// A zeroed buffer of `len` elements holding `pages` bytes of `domain`, given back when it
    /// drops. Zeroed vectors come from calloc/mmap: pages are only backed once touched, so a full
    /// domain can be modelled without 4 GiB of RAM.
    pub(super) fn new(
        len: usize,
        cacheable: bool,
        strict: bool,
        domain: u32,
        pages: u64,
        shared: Arc<Shared>,
    ) -> EmuStorage<T> {
        EmuStorage {
            cpu: Lines::zeroed(len),
            dev: None,
            spare: Lines::default(),
            differs: None,
            cacheable,
            strict,
            fresh: true,
            cpu_dirty: false,
            dev_newer: false,
            domain,
            pages,
            shared,
        }
    }

    /// What the NPU reads.
    fn device_view(&self) -> &[T] {
        self.dev.as_deref().unwrap_or(&self.cpu)
    }

    /// What a submit reads of this buffer as its `operand`. CPU writes not synced to the device
    /// are an error when `strict`; otherwise the stale device view is read, as on the board.
    pub(super) fn input_view(&self, operand: &'static str, strict: bool) -> Result<&[T]> {
        if self.cpu_dirty {
            if strict {
                return Err(Error::NotSynced { operand });
            }
            log::warn!(
                "emu: {operand} was written by the CPU and not synced: the NPU reads stale data"
            );
        }
        Ok(self.device_view())
    }

    /// Gives a cacheable buffer a device view of its own, holding what the device sees now except
    /// in `overwritten` (sorted, disjoint ranges the caller writes next, whose old contents are
    /// then left as they are), and widens `differs` by `overwritten`.
    fn split_views(&mut self, overwritten: &[Range<usize>]) {
        if !self.cacheable {
            return;
        }
        if self.dev.is_none() {
            let len = self.cpu.len();
            let dev = if self.fresh {
                // A fresh buffer is all zero: a zeroed vector costs no copy and no touched pages.
                self.differs = Some(0..0);
                Lines::zeroed(len)
            } else {
                let mut dev = std::mem::take(&mut self.spare);
                let stale = match &self.differs {
                    Some(d) if dev.len() == len => d.clone(),
                    _ => {
                        dev = Lines::zeroed(len);
                        0..len
                    }
                };
                for r in outside(stale, overwritten) {
                    dev[r.clone()].copy_from_slice(&self.cpu[r]);
                }
                self.differs = Some(0..0);
                dev
            };
            self.dev = Some(dev);
        }
        self.fresh = false;
        if let (Some(d), Some(first), Some(last)) =
            (&mut self.differs, overwritten.first(), overwritten.last())
        {
            *d = if d.start == d.end {
                first.start..last.end
            } else {
                d.start.min(first.start)..d.end.max(last.end)
            };
        }
    }

    /// What a submit writes, all of it into `written` (sorted, disjoint ranges): the device view
    /// (made separate first for a cacheable buffer).
    pub(super) fn device_view_mut(&mut self, written: &[Range<usize>]) -> &mut [T] {
        self.split_views(written);
        self.dev_newer = self.cacheable;
        match &mut self.dev {
            Some(d) => d,
            None => &mut self.cpu,
        }
    }
}

impl<T> Drop for EmuStorage<T> {
    fn drop(&mut self) {
        self.shared.domains.release(self.domain, self.pages);
    }
}

impl<T: Copy + Default + Send + Sync + 'static> Storage<T> for EmuStorage<T> {
    fn cpu(&self) -> &[T] {
        if self.dev_newer {
            // Debug level: polling a buffer before syncing is legitimate, if pointless.
            log::debug!(
                "emu: CPU reads a cacheable buffer the NPU wrote, without sync_from_device"
            );
        }
        &self.cpu
    }

    fn cpu_mut(&mut self) -> &mut [T] {
        if self.strict {
            self.fresh = false;
        } else {
            self.split_views(&[]);
        }
        // The CPU may write anywhere.
        self.differs = None;
        self.cpu_dirty = self.cacheable;
        &mut self.cpu
    }

    fn sync_to_device(&mut self) -> Result<()> {
        if let Some(msg) = self.shared.faults.fails(FaultOp::SyncToDevice) {
            return Err(Error::Device(msg));
        }
        // A flush writes back what the CPU dirtied; untouched lines leave the device's as they are.
        if self.cpu_dirty {
            if let Some(dev) = self.dev.take() {
                self.spare = dev;
            }
            self.cpu_dirty = false;
            self.dev_newer = false;
        }
        Ok(())
    }

    fn sync_from_device(&mut self) -> Result<()> {
        if let Some(msg) = self.shared.faults.fails(FaultOp::SyncFromDevice) {
            return Err(Error::Device(msg));
        }
        // An invalidate makes the CPU see the device's memory, dropping unflushed CPU writes.
        if let Some(dev) = self.dev.take() {
            self.spare = std::mem::replace(&mut self.cpu, dev);
        }
        self.cpu_dirty = false;
        self.dev_newer = false;
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The parts of `range` outside `holes` (sorted, disjoint).
fn outside(range: Range<usize>, holes: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut parts = Vec::new();
    let mut at = range.start;
    for h in holes {
        if h.start > at {
            parts.push(at..h.start.min(range.end));
        }
        at = at.max(h.end);
        if at >= range.end {
            break;
        }
    }
    if at < range.end {
        parts.push(at..range.end);
    }
    parts.retain(|p| !p.is_empty());
    parts
}

#[cfg(test)]
mod tests {
    use super::super::backend::Emu;
    use super::super::Config;
    use super::*;
    use crate::npu::exec::HostExec;
    use crate::npu::flags;

    fn written_and_rewritten(strict: bool) -> EmuStorage<i8> {
        let emu = Emu::new(
            Config {
                strict,
                ..Config::default()
            },
            HostExec::default(),
        );
        let mut s = emu.alloc::<i8>(4096, flags::CPU_FILLED, 0).unwrap();
        s.cpu_mut().fill(1);
        s.sync_to_device().unwrap();
        s.cpu_mut().fill(2);
        s
    }

    #[test]
    fn only_a_lenient_buffer_keeps_what_the_cpu_overwrote() {
        let lenient = written_and_rewritten(false);
        assert!(
            lenient.device_view().iter().all(|&x| x == 1),
            "stale view kept"
        );
        let mut strict = written_and_rewritten(true);
        assert!(strict.dev.is_none(), "no copy of the old contents");
        assert!(
            strict.cpu_dirty,
            "a submit still refuses the unflushed input"
        );
        strict.sync_to_device().unwrap();
        assert!(strict.device_view().iter().all(|&x| x == 2));
    }

    /// The two views as the emulator defines them, keeping a whole copy whenever they part.
    struct Views {
        cpu: Vec<i32>,
        dev: Option<Vec<i32>>,
        dirty: bool,
    }

    #[test]
    fn reused_views_show_what_whole_copies_show() {
        const LEN: usize = 64;
        let mut rng = crate::testutil::Rng::new(7);
        for strict in [true, false] {
            let emu = Emu::new(
                Config {
                    strict,
                    ..Config::default()
                },
                HostExec::default(),
            );
            let flags = flags::CPU_FILLED;
            let mut s = emu.alloc::<i32>(LEN, flags, 0).unwrap();
            let mut v = Views {
                cpu: vec![0; LEN],
                dev: None,
                dirty: false,
            };
            let mut value = 0;
            for step in 0..20_000 {
                value += 1;
                match rng.below(4) {
                    0 => {
                        let (a, b) = (rng.below(LEN), rng.below(LEN + 1));
                        let r = a.min(b)..a.max(b);
                        s.cpu_mut()[r.clone()].fill(value);
                        if !strict && v.dev.is_none() {
                            v.dev = Some(v.cpu.clone());
                        }
                        v.cpu[r].fill(value);
                        v.dirty = true;
                    }
                    1 => {
                        // Up to three disjoint regions, as a submit of several GEMMs writes.
                        let mut cuts: Vec<usize> = (0..6).map(|_| rng.below(LEN + 1)).collect();
                        cuts.sort();
                        let written: Vec<_> = cuts
                            .chunks(2)
                            .map(|c| c[0]..c[1])
                            .filter(|r| !r.is_empty() && rng.below(3) > 0)
                            .collect();
                        let dev = s.device_view_mut(&written);
                        let model = v.dev.get_or_insert_with(|| v.cpu.clone());
                        for r in &written {
                            dev[r.clone()].fill(value);
                            model[r.clone()].fill(value);
                        }
                    }
                    2 => {
                        s.sync_to_device().unwrap();
                        if v.dirty {
                            v.dev = None;
                            v.dirty = false;
                        }
                    }
                    _ => {
                        s.sync_from_device().unwrap();
                        if let Some(d) = v.dev.take() {
                            v.cpu = d;
                        }
                        v.dirty = false;
                    }
                }
                assert_eq!(*s.cpu, v.cpu, "CPU view, step {step}, strict {strict}");
                let model_dev = v.dev.as_ref().unwrap_or(&v.cpu);
                assert_eq!(s.device_view(), &model_dev[..], "device view, step {step}");
            }
        }
    }

    #[test]
    fn a_recycled_output_buffer_reuses_its_two_vectors() {
        let emu = Emu::new(Config::default(), HostExec::default());
        let mut s = emu.alloc::<i32>(1 << 16, flags::CPU_FILLED, 0).unwrap();
        let mut seen = std::collections::HashSet::new();
        for round in 0..8 {
            let n = 1000 + round * 3000;
            s.device_view_mut(std::slice::from_ref(&(0..n)))
                .fill(round as i32);
            s.sync_from_device().unwrap();
            assert!(s.cpu[..n].iter().all(|&x| x == round as i32));
            seen.insert(s.cpu.as_ptr());
        }
        assert!(seen.len() <= 2, "{} vectors for one buffer", seen.len());
    }
}
