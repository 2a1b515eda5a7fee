//! What holds a buffer's elements: the element types, the storage each backend gives a buffer,
//! and how a backend finds its own storage behind one.

use super::error::{Error, Result};
use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};

/// Element types a [`Buffer`](super::Buffer) can hold: int8 (A, B) and int32 (C).
pub trait Elem: Copy + Default + Send + Sync + fmt::Debug + 'static + sealed::Sealed {
    #[doc(hidden)]
    fn alloc<A: Alloc + ?Sized>(
        dev: &A,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<Box<dyn Storage<Self>>>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i8 {}
    impl Sealed for i32 {}
}

impl Elem for i8 {
    fn alloc<A: Alloc + ?Sized>(
        dev: &A,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<Box<dyn Storage<i8>>> {
        dev.alloc_i8(len, flags, domain)
    }
}

impl Elem for i32 {
    fn alloc<A: Alloc + ?Sized>(
        dev: &A,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<Box<dyn Storage<i32>>> {
        dev.alloc_i32(len, flags, domain)
    }
}

/// How a backend creates storage: one method per element type, picked by [`Elem::alloc`].
#[doc(hidden)]
pub trait Alloc {
    fn alloc_i8(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i8>>>;
    fn alloc_i32(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i32>>>;
}

/// Backend side of a buffer: a CPU view and whatever the device reads.
#[doc(hidden)]
pub trait Storage<T>: Send + Sync {
    fn cpu(&self) -> &[T];
    /// The CPU view for writing; the storage notes that the CPU made it dirty.
    fn cpu_mut(&mut self) -> &mut [T];
    fn sync_to_device(&mut self) -> Result<()>;
    fn sync_from_device(&mut self) -> Result<()>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

fn foreign_buffer() -> Error {
    Error::InvalidArgument("buffer of another backend".into())
}

/// A backend's own storage type `S` behind a buffer's storage.
pub(super) fn storage_as<S: 'static, T>(s: &dyn Storage<T>) -> Result<&S> {
    s.as_any().downcast_ref().ok_or_else(foreign_buffer)
}

pub(super) fn storage_as_mut<S: 'static, T>(s: &mut dyn Storage<T>) -> Result<&mut S> {
    s.as_any_mut().downcast_mut().ok_or_else(foreign_buffer)
}

/// Zeroed memory of `len` elements starting on a 64-byte cache line, as the board's buffers
/// (page-aligned dma-bufs) start: the CPU's wide stores into a buffer (the inflate's 32- and
/// 64-byte runs) split no line here either. A large `Vec` starts 16 bytes into its page, which
/// made every other such store a split one.
pub struct Lines<T> {
    buf: Vec<T>,
    at: usize,
    len: usize,
}

impl<T: Copy + Default> Lines<T> {
    /// `len` zeroed elements. The vector comes from calloc/mmap, so its pages are only backed
    /// once touched.
    pub fn zeroed(len: usize) -> Lines<T> {
        let pad = 64 / std::mem::size_of::<T>();
        let buf = vec![T::default(); len + pad];
        let at = buf.as_ptr().align_offset(64).min(pad);
        Lines { buf, at, len }
    }
}

impl<T> Default for Lines<T> {
    fn default() -> Lines<T> {
        Lines {
            buf: Vec::new(),
            at: 0,
            len: 0,
        }
    }
}

impl<T> Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.at..self.at + self.len]
    }
}

impl<T> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::Lines;

    #[test]
    fn lines_start_on_a_cache_line_zeroed() {
        for len in [0, 1, 63, 64, 1000, 3 << 20] {
            let mut a = Lines::<i8>::zeroed(len);
            let b = Lines::<i32>::zeroed(len);
            assert_eq!((a.len(), b.len()), (len, len));
            assert_eq!(a.as_ptr() as usize % 64, 0, "i8, {len}");
            assert_eq!(b.as_ptr() as usize % 64, 0, "i32, {len}");
            assert!(a.iter().all(|&x| x == 0) && b.iter().all(|&x| x == 0));
            // The whole length is writable.
            a.iter_mut().enumerate().for_each(|(i, x)| *x = i as i8);
            assert!(a.iter().enumerate().all(|(i, &x)| x == i as i8));
        }
    }
}
