//! Matmul contexts: creation (one shape, or a dynamic-shape context serving a range of M), the check
//! of the tensor attributes the runtime reports against the layout the packer writes, and one run.

use super::check;
use super::diag::code_name;
use super::sys::{self, Api, Context, IoAttr, MatmulInfo, MatmulShape, TensorAttr, TensorMem};
use crate::layout::Tiles;
use crate::npu::error::{Error, Result};
use crate::sync::lock;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

/// One matmul context and the tensor attributes the runtime gave each of its shapes.
pub struct MatmulCtx {
    api: Arc<Api>,
    pub ctx: Context,
    k: usize,
    n: usize,
    /// The M values it runs: one, or the dynamic range its shapes cover in order.
    ms: RangeInclusive<usize>,
    dynamic: bool,
    io: Vec<IoAttr>,
    /// The dynamic shape selected last (index into `io`).
    current: Option<usize>,
}

// SAFETY: a context handle is an integer the runtime accepts from any thread; every use goes
// through a Mutex, so one context is never driven by two threads at once.
unsafe impl Send for MatmulCtx {}

impl MatmulCtx {
    /// A context for exactly `m` rows (`dynamic == false`), or for every M in `ms` through the
    /// runtime's dynamic shapes. `core`: pin it to that NPU core (`None`: leave the runtime's default,
    /// as on single-core chips, where the call fails).
    pub fn create(
        api: &Arc<Api>,
        ms: RangeInclusive<usize>,
        dynamic: bool,
        k: usize,
        n: usize,
        domain: u32,
        core: Option<usize>,
    ) -> std::result::Result<MatmulCtx, CreateError> {
        let mut info = MatmulInfo::int8_native(*ms.end(), k, n, domain);
        let mut ctx: Context = 0;
        let (code, io) = if dynamic {
            let dynamic_api = api
                .dynamic
                .as_ref()
                .expect("dynamic contexts need the dynamic API");
            let mut shapes: Vec<MatmulShape> = ms
                .clone()
                .map(|m| MatmulShape {
                    m: m as i32,
                    k: k as i32,
                    n: n as i32,
                })
                .collect();
            let mut io = vec![IoAttr::zeroed(); shapes.len()];
            // SAFETY: info and ctx are writable; shapes and io hold shape_num elements each.
            let code = unsafe {
                (dynamic_api.create)(
                    &mut ctx,
                    &mut info,
                    shapes.len() as i32,
                    shapes.as_mut_ptr(),
                    io.as_mut_ptr(),
                )
            };
            (code, io)
        } else {
            let mut io = vec![IoAttr::zeroed()];
            // SAFETY: all three pointers are valid and writable for their C types (layouts checked in sys).
            let code = unsafe { (api.matmul_create)(&mut ctx, &mut info, &mut io[0]) };
            (code, io)
        };
        if code != sys::SUCC {
            return Err(CreateError::Refused {
                code,
                call: format!(
                    "rknn_matmul_create{} (M={}, K={k}, N={n}, domain {domain})",
                    if dynamic { "_dynamic_shape" } else { "" },
                    shape_text(&ms)
                ),
            });
        }
        let made = MatmulCtx {
            api: Arc::clone(api),
            ctx,
            k,
            n,
            ms,
            dynamic,
            io,
            current: None,
        };
        if let Some(core) = core {
            // SAFETY: ctx was just created by this runtime.
            check("rknn_matmul_set_core_mask", unsafe {
                (api.matmul_set_core_mask)(ctx, sys::CORE_0 << core)
            })?;
        }
        Ok(made)
    }

    /// Tile sizes from the first shape's attributes: B native `(N/bn, K/bk, bn, bk)`, A `(K/ak, M,
    /// ak)`, C `(N/cn, M, cn)`.
    pub fn tiles(&self) -> Result<Tiles> {
        let dim = |t: &TensorAttr, i: usize| {
            (t.n_dims as usize > i && t.dims[i] > 0).then_some(t.dims[i] as usize)
        };
        let io = &self.io[0];
        let (b_n, b_k) = dim(&io.b, 2)
            .zip(dim(&io.b, 3))
            .ok_or_else(|| Error::Device("the runtime reported no native B tile sizes".into()))?;
        let d = Tiles::RK3588;
        Ok(Tiles {
            a_k: dim(&io.a, 2).unwrap_or(d.a_k),
            b_n,
            b_k,
            c_n: dim(&io.c, 2).unwrap_or(d.c_n),
            align: d.align.max(b_n).max(b_k),
        })
    }

    /// Checks every shape's reported attributes against what the packer lays out with `tiles`:
    /// types, dims and sizes. A runtime that wants another layout (other tiles, B split in K
    /// segments) gets a clear error instead of a wrong result.
    pub fn check_layout(&self, tiles: &Tiles) -> Result<()> {
        let (k, n) = (self.k, self.n);
        for (io, m) in self.io.iter().zip(self.ms.clone()) {
            let want: [(&str, &TensorAttr, i32, Vec<usize>, usize); 3] = [
                (
                    "A",
                    &io.a,
                    sys::TENSOR_INT8,
                    vec![k / tiles.a_k, m, tiles.a_k],
                    m * k,
                ),
                (
                    "B",
                    &io.b,
                    sys::TENSOR_INT8,
                    vec![n / tiles.b_n, k / tiles.b_k, tiles.b_n, tiles.b_k],
                    k * n,
                ),
                (
                    "C",
                    &io.c,
                    sys::TENSOR_INT32,
                    vec![n / tiles.c_n, m, tiles.c_n],
                    4 * m * n,
                ),
            ];
            for (name, attr, ty, dims, size) in want {
                let got: Vec<usize> = attr.dims[..(attr.n_dims as usize).min(sys::MAX_DIMS)]
                    .iter()
                    .map(|&d| d as usize)
                    .collect();
                if attr.ty != ty || got != dims || attr.size as usize != size {
                    return Err(Error::Device(format!(
                        "the runtime lays out {name} of an M={m} K={k} N={n} int8 matmul as dims \
                         {got:?}, {} bytes, type {}; the packer writes dims {dims:?}, {size} bytes, \
                         type {ty} (tiles {tiles:?})",
                        attr.size, attr.ty
                    )));
                }
            }
        }
        Ok(())
    }

    /// Binds A, B and C for `m` rows (under `bind`, the one lock every binding in the process takes,
    /// since the runtime does not document set_io_mem as thread-safe), then runs: only the run
    /// itself overlaps other contexts' work.
    pub fn run(
        &mut self,
        bind: &Mutex<()>,
        m: usize,
        operands: [(*mut TensorMem, usize); 3],
    ) -> Result<()> {
        let idx = m
            .checked_sub(*self.ms.start())
            .filter(|_| self.ms.contains(&m))
            .ok_or_else(|| {
                Error::Device(format!(
                    "context for M={} asked to run M={m}",
                    shape_text(&self.ms)
                ))
            })?;
        {
            let _bind = lock(bind);
            if self.dynamic && self.current != Some(idx) {
                let mut shape = MatmulShape {
                    m: m as i32,
                    k: self.k as i32,
                    n: self.n as i32,
                };
                let set_shape = self.api.dynamic.as_ref().expect("dynamic API").set_shape;
                // A failed switch leaves the shape unknown.
                self.current = None;
                // SAFETY: a live dynamic context and a shape it was created with.
                check("rknn_matmul_set_dynamic_shape", unsafe {
                    set_shape(self.ctx, &mut shape)
                })?;
                self.current = Some(idx);
            }
            let io = &mut self.io[idx];
            let attrs: [&mut TensorAttr; 3] = [&mut io.a, &mut io.b, &mut io.c];
            for ((mem, bytes), attr) in operands.into_iter().zip(attrs) {
                if bytes < attr.size as usize {
                    return Err(Error::Device(format!(
                        "the runtime wants {} bytes for an operand of {bytes}",
                        attr.size
                    )));
                }
                // SAFETY: mem is a live tensor_mem (a buffer, view or staging buffer the job holds),
                // attr this context's attribute (the runtime reads it); the runtime records mem for
                // the run below.
                check("rknn_matmul_set_io_mem", unsafe {
                    (self.api.matmul_set_io_mem)(self.ctx, mem, attr)
                })?;
            }
        }
        // SAFETY: ctx has all three operands bound.
        check("rknn_matmul_run", unsafe {
            (self.api.matmul_run)(self.ctx)
        })
    }
}

impl Drop for MatmulCtx {
    fn drop(&mut self) {
        // SAFETY: ctx is live and owned by this value; nothing uses it after the drop.
        let code = unsafe { (self.api.matmul_destroy)(self.ctx) };
        if code != sys::SUCC {
            log::warn!(
                "rknn_matmul_destroy failed with {code} ({})",
                code_name(code)
            );
        }
    }
}

fn shape_text(ms: &RangeInclusive<usize>) -> String {
    if ms.start() == ms.end() {
        ms.start().to_string()
    } else {
        format!("{}..={}", ms.start(), ms.end())
    }
}

/// Why a context could not be made: the runtime refused the create call (its code; open() turns
/// that into the no-device diagnosis), or a later step failed.
pub enum CreateError {
    Refused { code: i32, call: String },
    Failed(Error),
}

impl From<Error> for CreateError {
    fn from(e: Error) -> CreateError {
        CreateError::Failed(e)
    }
}

impl From<CreateError> for Error {
    fn from(e: CreateError) -> Error {
        match e {
            CreateError::Refused { code, call } => {
                Error::Device(format!("{call} failed with {code} ({})", code_name(code)))
            }
            CreateError::Failed(e) => e,
        }
    }
}
