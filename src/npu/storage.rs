//! What holds a buffer's elements: the element types, the storage each backend gives a buffer,
//! and how a backend finds its own storage behind one.

use super::error::{Error, Result};
use std::any::Any;
use std::fmt;

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
