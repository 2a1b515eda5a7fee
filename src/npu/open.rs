//! Which backend a device opens: the choice (`ORK_BACKEND`), its settings, the opening of each
//! backend, and the one log line that says what was chosen.

use super::backend::Backend;
use super::device::Device;
use super::error::Result;
use super::exec::HostExec;
use super::kinds::{BackendKind, CoreMask};
use super::{cpu, emu, rknn};
use std::sync::Once;

/// Backend selection, as in `ORK_BACKEND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// `rknn` when the runtime loads and answers, else `emu`.
    Auto,
    Emu,
    Rknn,
    Cpu,
}

impl BackendChoice {
    pub fn parse(s: &str) -> Option<BackendChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Some(BackendChoice::Auto),
            "emu" => Some(BackendChoice::Emu),
            "rknn" => Some(BackendChoice::Rknn),
            "cpu" => Some(BackendChoice::Cpu),
            _ => None,
        }
    }
}

/// What [`Device::open`] opens: the backend and its settings (`crate::config` fills it).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceConfig {
    pub backend: BackendChoice,
    /// The vendor runtime's settings (`ORK_RKNN_LIB`, `ORK_RKNN_DYNAMIC_M`).
    pub rknn: rknn::Config,
    /// Cores of `run_i8` and `run_stream_i8`.
    pub core_mask: CoreMask,
    /// Kernel path and pool threads of the CPU-executed backends (emu, cpu).
    pub host: HostExec,
    pub emu: emu::Config,
}

impl Default for DeviceConfig {
    fn default() -> DeviceConfig {
        DeviceConfig {
            backend: BackendChoice::Auto,
            rknn: rknn::Config::default(),
            core_mask: CoreMask::ALL,
            host: HostExec::default(),
            emu: emu::Config::default(),
        }
    }
}

static LOG_CHOICE: Once = Once::new();

impl Device {
    /// The emulated RK3588 NPU with `config`, on the best kernel path and every core.
    pub fn emu(config: emu::Config) -> Device {
        Device::emu_monitored(config).0
    }

    /// [`Device::emu`], with a view of the emulator's domain accounting and operation counts
    /// that stays valid after the device is dropped (leak and fault-injection checks).
    pub fn emu_monitored(config: emu::Config) -> (Device, emu::Monitor) {
        let emu = emu::Emu::new(config, HostExec::default());
        let monitor = emu.monitor();
        (Device::with_backend(Box::new(emu)), monitor)
    }

    /// The CPU int8 GEMM behind the device interface, on the best kernel path and every core.
    pub fn cpu() -> Device {
        Device::with_backend(Box::new(cpu::Cpu::new(HostExec::default())))
    }

    /// The vendor runtime, from `path` or the default library names.
    pub fn rknn(path: Option<&str>) -> Result<Device> {
        rknn::open(path).map(Device::with_backend)
    }

    /// The vendor runtime with explicit settings.
    pub fn rknn_with(config: &rknn::Config) -> Result<Device> {
        rknn::open_with(config).map(Device::with_backend)
    }

    /// Opens the backend `cfg` names; `Auto` tries `rknn` and falls back to `emu`. The device's
    /// core mask starts as `cfg.core_mask`.
    pub fn open(cfg: &DeviceConfig) -> Result<Device> {
        let emu = || emu::Emu::new(cfg.emu.clone(), cfg.host);
        let backend: Box<dyn Backend> = match cfg.backend {
            BackendChoice::Emu => Box::new(emu()),
            BackendChoice::Cpu => Box::new(cpu::Cpu::new(cfg.host)),
            BackendChoice::Rknn => rknn::open_with(&cfg.rknn)?,
            BackendChoice::Auto => rknn::open_with(&cfg.rknn).unwrap_or_else(|e| {
                log::debug!("rknn backend unavailable ({e}); using the emulator");
                Box::new(emu())
            }),
        };
        let dev = Device::with_backend(backend);
        dev.set_core_mask(cfg.core_mask);
        LOG_CHOICE.call_once(|| log_choice(cfg, dev.backend()));
        Ok(dev)
    }
}

/// Says which backend `cfg` opened, and where the emulator's cost model came from.
fn log_choice(cfg: &DeviceConfig, opened: BackendKind) {
    let profile = match (&cfg.emu.profile, opened) {
        (Some(p), BackendKind::Emu) => {
            format!("; cost model from board profile {}", p.display())
        }
        _ => String::new(),
    };
    log::info!(
        "NPU backend: {} (ORK_BACKEND={:?}){profile}",
        opened.name(),
        cfg.backend
    )
}
