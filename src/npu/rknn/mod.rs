//! The real backend: `librknnrt.so` through `dlopen` (binding in progress).

use super::{Backend, Error, Result};

/// Opens the vendor runtime at `path` (or the default names).
pub fn open(_path: Option<&str>) -> Result<Box<dyn Backend>> {
    Err(Error::Device("the rknn binding is not built yet".into()))
}
