//! A submit's GEMMs as runtime matmuls: the checks this backend adds, the channel ranges each
//! GEMM is split into, and the tensor_mem every operand is bound through (the buffer, a view of
//! it, or a staged copy).

use super::job::{RunTask, Staged};
use super::mem::{Mem, RknnStorage};
use super::sys::{self, TensorMem};
use super::{Rknn, MAX_K};
use crate::layout::Tiles;
use crate::npu::buffer::Buffer;
use crate::npu::envelope::in_stream_envelope;
use crate::npu::error::{Error, Result};
use crate::npu::exec::split_channels;
use crate::npu::kinds::Primitive;
use crate::npu::storage::{storage_as, Elem};
use crate::npu::submit::{MatMul, Report};

/// Rejects a GEMM this backend does not run: a K outside the envelope of `primitive`, or an
/// operand outside C's IOMMU `domain`.
pub(super) fn check_gemm(primitive: Primitive, g: &MatMul, domain: u32) -> Result<()> {
    let envelope = match primitive {
        Primitive::RunI8 => g.k <= MAX_K,
        _ => in_stream_envelope(g.k),
    };
    if !envelope {
        let reason = format!("K={} outside the {} envelope", g.k, primitive.name());
        return Err(Error::Envelope { primitive, reason });
    }
    for found in [g.a.domain(), g.b.domain()] {
        if found != domain {
            return Err(Error::DomainMismatch {
                expected: domain,
                found,
            });
        }
    }
    Ok(())
}

/// The (core, n0, n1) runs of the `gi`-th GEMM, of `n` channels: `run_i8` over all `cores`,
/// chain on the first, stream each GEMM on the next core in turn.
pub(super) fn channel_splits(
    primitive: Primitive,
    gi: usize,
    n: usize,
    tiles: &Tiles,
    cores: &[usize],
) -> Vec<(usize, usize, usize)> {
    match primitive {
        Primitive::RunI8 => split_channels(tiles, 0, n, cores),
        Primitive::ChainI8 => vec![(cores[0], 0, n)],
        Primitive::StreamI8 => vec![(cores[gi % cores.len()], 0, n)],
    }
}

/// A submit's runs as they are bound: the units its shares claim, the staging buffers they
/// hold, and the report.
pub(super) struct Runs<'s> {
    pub(super) units: Vec<Vec<RunTask>>,
    pub(super) staged: Staged<'s>,
    pub(super) report: Report,
}

impl Runs<'_> {
    /// Adds a run on `core`. Chain: everything on one unit (one core, in order); otherwise a
    /// unit per run.
    fn add(&mut self, primitive: Primitive, core: usize, task: RunTask) {
        self.report.tasks_per_core[core] += 1;
        match (primitive, self.units.last_mut()) {
            (Primitive::ChainI8, Some(u)) => u.push(task),
            _ => self.units.push(vec![task]),
        }
    }
}

/// An operand: a buffer and an element range of it.
struct Operand<'b, T: Elem> {
    buf: &'b Buffer<T>,
    offset: usize,
    len: usize,
}

impl Rknn {
    /// Binds the runs of `g`, one per (core, n0, n1) of `splits`: A once, B and C per range, each
    /// run on the context of its shape and core.
    pub(super) fn bind_gemm<'s>(
        &'s self,
        primitive: Primitive,
        g: &MatMul<'_>,
        splits: &[(usize, usize, usize)],
        c: &Buffer<i32>,
        runs: &mut Runs<'s>,
    ) -> Result<()> {
        let a_len = g.m * g.k;
        let a = Operand {
            buf: g.a,
            offset: g.a_offset,
            len: a_len,
        };
        let a = self.bind_input(a, &mut runs.staged)?;
        for &(core, n0, n1) in splits {
            let np = n1 - n0;
            let (ctx, created) = self.context(g.m, g.k, np, core, c.domain())?;
            runs.report.contexts_created += u64::from(created);
            let b = Operand {
                buf: g.b,
                offset: g.b_offset + n0 * g.k,
                len: g.k * np,
            };
            let c_op = Operand {
                buf: c,
                offset: g.c_offset + n0 * g.m,
                len: g.m * np,
            };
            let operands = [
                (a, a_len),
                (self.bind_input(b, &mut runs.staged)?, g.k * np),
                (self.bind_output(c_op, &mut runs.staged)?, 4 * g.m * np),
            ];
            runs.report.bytes += (g.m * g.k + g.k * np + 4 * g.m * np) as u64;
            let task = RunTask {
                ctx,
                m: g.m,
                operands,
            };
            runs.add(primitive, core, task);
        }
        runs.report.macs += g.macs();
        Ok(())
    }

    /// The tensor_mem to bind for an input: the buffer or its view, or a staged copy.
    fn bind_input(&self, op: Operand<'_, i8>, staged: &mut Staged<'_>) -> Result<*mut TensorMem> {
        let s = storage_as::<RknnStorage<i8>, i8>(op.buf.storage())?;
        if let Some(mem) = s.mem.binding(op.offset)? {
            return Ok(mem);
        }
        let mut copy = self.stage(op.len, op.buf.domain())?;
        let src = &op.buf.as_slice()[op.offset..op.offset + op.len];
        for (d, &s) in copy.cpu_bytes_mut().iter_mut().zip(src) {
            *d = s as u8;
        }
        copy.sync(sys::SYNC_TO_DEVICE)?;
        let mem = copy.tensor_ptr();
        staged.inputs.push(copy);
        Ok(mem)
    }

    /// The tensor_mem to bind for an output slice: C itself at its start, else a staging buffer.
    fn bind_output(&self, op: Operand<'_, i32>, staged: &mut Staged<'_>) -> Result<*mut TensorMem> {
        let s = storage_as::<RknnStorage<i32>, i32>(op.buf.storage())?;
        if op.offset == 0 {
            return Ok(s.mem.tensor_ptr());
        }
        let out = self.stage(4 * op.len, op.buf.domain())?;
        let mem = out.tensor_ptr();
        staged.outputs.push((out, op.offset, op.len));
        Ok(mem)
    }

    fn stage(&self, bytes: usize, domain: u32) -> Result<Mem> {
        self.spares
            .take(bytes, domain, |b| self.shared.alloc(b, true, false, domain))
    }
}
