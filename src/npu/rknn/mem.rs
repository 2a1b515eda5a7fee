//! Runtime memory: buffers (`rknn_create_mem2`), the views of them that operands at an offset need
//! (`rknn_create_mem_from_fd`), and spare staging buffers.
//!
//! A view is created once per (buffer, offset), on the buffer's own allocation context, spanning
//! from the offset to the buffer's end (the runtime wants at least the operand's size, so one view
//! serves every length), and kept until the buffer is destroyed: views die in the buffer's `Drop`,
//! immediately before it. Whether destroying a view releases a driver import the buffer still uses
//! is undocumented, so no view is ever destroyed while its buffer lives. A buffer holds at most
//! [`MAX_VIEWS`] views; an operand past that, or at an offset the C API's `int32_t` cannot carry
//! (2 GiB and beyond), is copied through a staging buffer instead.

use super::check;
use super::ctx::MatmulCtx;
use super::diag::code_name;
use super::sys::{self, Api, TensorMem};
use crate::npu::error::{Error, Result};
use crate::npu::storage::Storage;
use crate::sync::lock;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Views one buffer may hold (each is a driver import).
pub const MAX_VIEWS: usize = 64;
/// Staging buffers kept for reuse, and their total bytes.
const SPARE_COUNT: usize = 16;
const SPARE_BYTES: usize = 64 << 20;
/// Staging sizes are rounded up to this, so that spares fit later requests.
const SPARE_GRAIN: usize = 64 << 10;

/// One runtime allocation and the views of it.
pub struct Mem {
    api: Arc<Api>,
    /// The allocation context of the buffer's domain (memory belongs to a context).
    ctx: Arc<Mutex<MatmulCtx>>,
    mem: NonNull<TensorMem>,
    bytes: usize,
    cacheable: bool,
    domain: u32,
    /// (byte offset, view) pairs.
    views: Mutex<Vec<(usize, NonNull<TensorMem>)>>,
}

// SAFETY: the Mem owns its rknn_tensor_mem and views exclusively; runtime calls on them go through
// the allocation context's Mutex, the view list through its own; the CPU mapping is plain memory
// whose access the owning storage guards (&self reads, &mut self writes).
unsafe impl Send for Mem {}
// SAFETY: as above.
unsafe impl Sync for Mem {}

impl Mem {
    /// `bytes` of runtime memory in the domain of `ctx`.
    pub fn alloc(
        api: &Arc<Api>,
        ctx: Arc<Mutex<MatmulCtx>>,
        bytes: usize,
        cacheable: bool,
        sram: bool,
        domain: u32,
    ) -> Result<Mem> {
        let mut flags = if cacheable {
            sys::MEM_CACHEABLE
        } else {
            sys::MEM_NON_CACHEABLE
        };
        if sram {
            flags |= sys::MEM_TRY_ALLOC_SRAM;
        }
        // SAFETY: the context is a live context of this runtime.
        let mem = unsafe { (api.create_mem2)(lock(&ctx).ctx, bytes as u64, flags) };
        let mem = NonNull::new(mem).ok_or(Error::OutOfMemory {
            domain,
            requested: bytes as u64,
            available: 0,
        })?;
        let made = Mem {
            api: Arc::clone(api),
            ctx,
            mem,
            bytes,
            cacheable,
            domain,
            views: Mutex::new(Vec::new()),
        };
        let m = made.tensor();
        if m.virt_addr.is_null() || (m.size as usize) < bytes {
            return Err(Error::Device(format!(
                "rknn_create_mem2 returned {} bytes at {:?} for {bytes}",
                m.size, m.virt_addr
            )));
        }
        Ok(made)
    }

    fn tensor(&self) -> &TensorMem {
        // SAFETY: mem came from rknn_create_mem2 and lives until Drop.
        unsafe { self.mem.as_ref() }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn domain(&self) -> u32 {
        self.domain
    }

    pub fn cpu_ptr(&self) -> *mut u8 {
        self.tensor().virt_addr.cast()
    }

    /// The buffer's own `rknn_tensor_mem`, to bind it whole.
    pub fn tensor_ptr(&self) -> *mut TensorMem {
        self.mem.as_ptr()
    }

    /// The CPU view of all its bytes.
    pub fn cpu_bytes(&self) -> &[u8] {
        // SAFETY: the runtime maps `bytes` bytes at virt_addr (checked at creation) until Drop;
        // &self keeps the mapping alive and no &mut exists meanwhile.
        unsafe { std::slice::from_raw_parts(self.cpu_ptr(), self.bytes) }
    }

    /// The CPU view for writing.
    pub fn cpu_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in cpu_bytes(); &mut self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.cpu_ptr(), self.bytes) }
    }

    /// The `rknn_tensor_mem` to bind for an operand at byte `offset`: the buffer itself at 0, else
    /// its view at that offset (created now if new). `None`: no view can serve (the offset does not
    /// fit the C API's int32, or the buffer has [`MAX_VIEWS`]); stage the operand.
    pub fn binding(&self, offset: usize) -> Result<Option<*mut TensorMem>> {
        if offset == 0 {
            return Ok(Some(self.mem.as_ptr()));
        }
        let Ok(offset_i32) = i32::try_from(offset) else {
            return Ok(None);
        };
        let mut views = lock(&self.views);
        if let Some((_, v)) = views.iter().find(|(o, _)| *o == offset) {
            return Ok(Some(v.as_ptr()));
        }
        if views.len() >= MAX_VIEWS {
            return Ok(None);
        }
        let parent = self.tensor();
        let ctx = lock(&self.ctx);
        // SAFETY: a view of this buffer's dma-buf from `offset` to its end (offset < bytes: the
        // operand was validated inside the buffer); destroyed in Drop, before the buffer.
        let v = unsafe {
            (self.api.create_mem_from_fd)(
                ctx.ctx,
                parent.fd,
                parent.virt_addr,
                (self.bytes - offset) as u32,
                offset_i32,
            )
        };
        let v = NonNull::new(v).ok_or_else(|| {
            Error::Device(format!(
                "rknn_create_mem_from_fd failed for a view at byte {offset} of a {}-byte buffer",
                self.bytes
            ))
        })?;
        views.push((offset, v));
        Ok(Some(v.as_ptr()))
    }

    /// `rknn_mem_sync` of the whole buffer (a no-op when it is not cacheable).
    pub fn sync(&self, mode: i32) -> Result<()> {
        if !self.cacheable {
            return Ok(());
        }
        let ctx = lock(&self.ctx);
        // SAFETY: ctx and mem are live objects of this runtime.
        check("rknn_mem_sync", unsafe {
            (self.api.mem_sync)(ctx.ctx, self.mem.as_ptr(), mode)
        })
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        let views = std::mem::take(self.views.get_mut().unwrap_or_else(|e| e.into_inner()));
        let ctx = lock(&self.ctx);
        let destroy = |what: &str, mem: *mut TensorMem| {
            // SAFETY: mem was created on this context and is not used after this.
            let code = unsafe { (self.api.destroy_mem)(ctx.ctx, mem) };
            if code != sys::SUCC {
                log::warn!(
                    "rknn_destroy_mem of {what} failed with {code} ({})",
                    code_name(code)
                );
            }
        };
        // Views first: none may outlive the buffer they show.
        for (_, v) in views {
            destroy("a view", v.as_ptr());
        }
        destroy("a buffer", self.mem.as_ptr());
    }
}

/// A runtime buffer seen as `len` elements of `T`.
pub struct RknnStorage<T> {
    pub mem: Mem,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

impl<T> RknnStorage<T> {
    pub fn new(mem: Mem, len: usize) -> RknnStorage<T> {
        debug_assert!(len * std::mem::size_of::<T>() <= mem.bytes());
        RknnStorage {
            mem,
            len,
            _elem: std::marker::PhantomData,
        }
    }
}

impl<T: Send + Sync + 'static> Storage<T> for RknnStorage<T> {
    fn cpu(&self) -> &[T] {
        // SAFETY: the runtime maps at least len·size_of::<T>() bytes at virt_addr (checked at
        // creation), page-aligned, until destroy_mem in Drop; &self keeps the mapping alive and
        // no &mut exists meanwhile.
        unsafe { std::slice::from_raw_parts(self.mem.cpu_ptr() as *const T, self.len) }
    }

    fn cpu_mut(&mut self) -> &mut [T] {
        // SAFETY: as in cpu(); &mut self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.mem.cpu_ptr() as *mut T, self.len) }
    }

    fn sync_to_device(&mut self) -> Result<()> {
        self.mem.sync(sys::SYNC_TO_DEVICE)
    }

    fn sync_from_device(&mut self) -> Result<()> {
        self.mem.sync(sys::SYNC_FROM_DEVICE)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Spare cacheable buffers for staged operands, per domain; handed out whole (offset 0, so no view).
#[derive(Default)]
pub struct Spares {
    pool: Mutex<Vec<Mem>>,
}

impl Spares {
    /// A buffer of at least `bytes` in `domain`: a spare, or `alloc(rounded size)`.
    pub fn take(
        &self,
        bytes: usize,
        domain: u32,
        alloc: impl FnOnce(usize) -> Result<Mem>,
    ) -> Result<Mem> {
        let mut pool = lock(&self.pool);
        let best = pool
            .iter()
            .enumerate()
            .filter(|(_, m)| m.domain() == domain && m.bytes() >= bytes)
            .min_by_key(|(_, m)| m.bytes())
            .map(|(i, _)| i);
        match best {
            Some(i) => Ok(pool.swap_remove(i)),
            None => {
                drop(pool);
                alloc(bytes.div_ceil(SPARE_GRAIN) * SPARE_GRAIN)
            }
        }
    }

    /// Keeps `m` for reuse within the count and byte limits (dropping the smallest first).
    pub fn give(&self, m: Mem) {
        let mut pool = lock(&self.pool);
        pool.push(m);
        while pool.len() > SPARE_COUNT || pool.iter().map(Mem::bytes).sum::<usize>() > SPARE_BYTES {
            let smallest = (0..pool.len())
                .min_by_key(|&i| pool[i].bytes())
                .expect("not empty");
            pool.swap_remove(smallest);
        }
    }
}
