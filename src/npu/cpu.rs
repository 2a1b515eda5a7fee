//! The `cpu` backend: the CPU int8 GEMM behind the device interface. No envelopes, no domains,
//! no cache model: one memory, syncs are no-ops. The fallback and the speed baseline.

use super::backend::{Backend, Job};
use super::error::Result;
use super::exec::{Execution, GemmView, HostExec, Split, Task};
use super::kinds::BackendKind;
use super::storage::{storage_as, storage_as_mut, Alloc, Lines, Storage};
use super::submit::{Report, Submit};
use crate::layout::Tiles;
use std::any::Any;

/// Plain memory.
pub struct CpuStorage<T> {
    data: Lines<T>,
}

impl<T: Send + Sync + 'static> Storage<T> for CpuStorage<T> {
    fn cpu(&self) -> &[T] {
        &self.data
    }

    fn cpu_mut(&mut self) -> &mut [T] {
        &mut self.data
    }

    fn sync_to_device(&mut self) -> Result<()> {
        Ok(())
    }

    fn sync_from_device(&mut self) -> Result<()> {
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The CPU backend.
pub struct Cpu {
    host: HostExec,
}

impl Cpu {
    pub fn new(host: HostExec) -> Cpu {
        Cpu { host }
    }
}

fn data<T: 'static>(s: &dyn Storage<T>) -> Result<&[T]> {
    Ok(&storage_as::<CpuStorage<T>, T>(s)?.data)
}

impl Alloc for Cpu {
    fn alloc_i8(&self, len: usize, _flags: u32, _domain: u32) -> Result<Box<dyn Storage<i8>>> {
        Ok(Box::new(CpuStorage {
            data: Lines::zeroed(len),
        }))
    }

    fn alloc_i32(&self, len: usize, _flags: u32, _domain: u32) -> Result<Box<dyn Storage<i32>>> {
        Ok(Box::new(CpuStorage {
            data: Lines::zeroed(len),
        }))
    }
}

impl Backend for Cpu {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn tiles(&self) -> Tiles {
        Tiles::RK3588
    }

    fn max_k(&self) -> usize {
        usize::MAX
    }

    fn threads(&self) -> usize {
        self.host.threads
    }

    fn prepare<'a>(&'a self, submit: Submit<'a>) -> Result<Box<dyn Job + 'a>> {
        let Submit {
            gemms, c, tiles, ..
        } = submit;
        let mut views = Vec::with_capacity(gemms.len());
        let mut tasks = Vec::with_capacity(gemms.len());
        let mut report = Report::default();
        for (i, g) in gemms.iter().enumerate() {
            views.push(GemmView {
                m: g.m,
                k: g.k,
                a: &data(g.a.storage())?[g.a_offset..g.a_offset + g.m * g.k],
                b: &data(g.b.storage())?[g.b_offset..g.b_offset + g.k * g.n],
            });
            tasks.push(Task {
                core: 0,
                gemm: i,
                n0: 0,
                n1: g.n,
                m0: 0,
                m1: g.m,
            });
            report.macs += g.macs();
        }
        let c_offsets: Vec<usize> = gemms.iter().map(|g| g.c_offset).collect();
        let split = Split {
            threads: self.host.threads,
            per_task: false,
        };
        let c = storage_as_mut::<CpuStorage<i32>, i32>(c.storage_mut())?;
        let exec = Execution::new(
            tiles,
            self.host.isa,
            views,
            &tasks,
            &mut c.data,
            &c_offsets,
            split,
        );
        Ok(Box::new(CpuJob { exec, report }))
    }
}

struct CpuJob<'a> {
    exec: Execution<'a>,
    report: Report,
}

impl Job for CpuJob<'_> {
    fn run_share(&self, _ith: usize, _nth: usize) {
        self.exec.run();
    }

    fn finish(self: Box<Self>) -> Result<Report> {
        Ok(self.report)
    }
}
