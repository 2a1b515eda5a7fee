//! Paths the library does not ship, kept to measure it against: the legacy via-f32 inflate
//! (`ork-probe inflate` and the sweep's `viaf32_us`) and the online-Hadamard lever
//! (`ork-probe accuracy`'s `library_hadamard` and its costs).

pub mod hadamard;
pub mod rotated;
pub mod via_f32;
