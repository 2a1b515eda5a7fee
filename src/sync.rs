//! Locking as the whole crate does it.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning: the crate never holds a lock across code that can panic while
/// the protected data is half-updated (pool shares run outside every lock; caches and counters
/// are updated in single steps), so a poisoned lock's data is still consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
