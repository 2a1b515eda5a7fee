//! The C ABI (filled in by the engine work).
