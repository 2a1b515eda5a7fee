//! The probe's library part: the RK3588 board timeline model ([`timeline`]), which
//! `ork-probe model` runs, the board check (`ork-probe board`) writes the parameters of, and the
//! integration tests load profiles with.

pub mod gguf;
pub mod timeline;
