//! The `cpu` backend: the CPU int8 GEMM behind the device interface. No envelopes, no domains,
//! no cache model: one memory, syncs are no-ops. The fallback and the speed baseline.

use super::exec::{self, Execution, GemmView, Task};
use super::{Backend, BackendKind, Error, Job, Report, Result, Storage, Submit};
use crate::layout::Tiles;
use std::any::Any;

/// Plain memory.
pub struct CpuStorage<T> {
    data: Vec<T>,
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
    threads: usize,
}

impl Cpu {
    pub fn new() -> Cpu {
        Cpu {
            threads: exec::cpu_threads(),
        }
    }
}

impl Default for Cpu {
    fn default() -> Cpu {
        Cpu::new()
    }
}

fn data<T: 'static>(s: &dyn Storage<T>) -> Result<&[T]> {
    let s: &CpuStorage<T> = s
        .as_any()
        .downcast_ref()
        .ok_or_else(|| Error::InvalidArgument("buffer of another backend".into()))?;
    Ok(&s.data)
}

impl Backend for Cpu {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn tiles(&self) -> Tiles {
        Tiles::RK3588
    }

    fn alloc_i8(&self, len: usize, _flags: u32, _domain: u32) -> Result<Box<dyn Storage<i8>>> {
        Ok(Box::new(CpuStorage {
            data: vec![0i8; len],
        }))
    }

    fn alloc_i32(&self, len: usize, _flags: u32, _domain: u32) -> Result<Box<dyn Storage<i32>>> {
        Ok(Box::new(CpuStorage {
            data: vec![0i32; len],
        }))
    }

    fn threads(&self) -> usize {
        self.threads
    }

    fn prepare<'a>(&'a self, submit: Submit<'a>) -> Result<Box<dyn Job + 'a>> {
        let Submit {
            mut gemms,
            c,
            tiles,
            ..
        } = submit;
        let mut views = Vec::with_capacity(gemms.len());
        let mut tasks = Vec::with_capacity(gemms.len());
        let mut report = Report::default();
        for (i, g) in gemms.iter().enumerate() {
            views.push(GemmView {
                m: g.m,
                k: g.k,
                n: g.n,
                a: &data(g.a.storage())?[g.a_offset..g.a_offset + g.m * g.k],
                b: &data(g.b.storage())?[g.b_offset..g.b_offset + g.k * g.n],
                chan: g.scaled.as_ref().map(|s| s.chan),
                rows: g.scaled.as_ref().and_then(|s| s.rows),
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
        let outs = exec::take_outs(&mut gemms);
        let total: usize = views.iter().map(|v| v.n).sum();
        let unit = total.div_ceil(self.threads * 2);
        let c: &'a mut CpuStorage<i32> = c
            .storage_mut()
            .as_any_mut()
            .downcast_mut()
            .ok_or_else(|| Error::InvalidArgument("buffer of another backend".into()))?;
        let exec = Execution::new(tiles, views, &tasks, &mut c.data, &c_offsets, outs, unit);
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
