//! What the board check reports of the machine (the rknpu driver, the CPU clusters, the memory
//! setup) and how it pins a measuring thread to one CPU.
//!
//! Everything is read from files a user can also read by hand (docs/BOARD.md section 1), and
//! whatever is missing is reported as unknown, with where it was looked for.

pub use ork_moe::cpus::Cpus;
use ork_moe::pool::allowed_cpus;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;

/// The rknpu kernel driver as this user can see it.
pub struct Driver {
    /// `0.9.8`, when a source gave it.
    pub version: Option<String>,
    /// Where the version came from, or where it was looked for.
    pub source: String,
    /// The DRM nodes and their drivers (`ork_moe::npu::rknn::device_nodes`).
    pub nodes: String,
}

/// Files holding the vendor driver's `RKNPU driver: v0.9.8` (debugfs: root only; procfs on kernels
/// built with its proc interface; sysfs for a loadable module).
const DRIVER_FILES: [&str; 3] = [
    "/sys/kernel/debug/rknpu/version",
    "/proc/rknpu/version",
    "/sys/module/rknpu/version",
];

/// The first `X.Y.Z` in `s`.
fn dotted_version(s: &str) -> Option<String> {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|w| w.split('.').count() == 3 && w.split('.').all(|p| !p.is_empty()))
        .map(String::from)
}

/// The driver's version from [`DRIVER_FILES`], else from its kernel log line (`[drm] Initialized
/// rknpu 0.9.8 20240828 for fdab0000.npu on minor 1`, or `Initialized RKNPU driver: v0.9.8` of
/// the DMA-heap build), else unknown with the reasons.
pub fn driver() -> Driver {
    let nodes = ork_moe::npu::rknn::device_nodes();
    let mut tried = Vec::new();
    for f in DRIVER_FILES {
        match std::fs::read_to_string(f) {
            Ok(text) => {
                if let Some(version) = dotted_version(&text) {
                    let source = format!("{f}: {}", text.trim());
                    return Driver {
                        version: Some(version),
                        source,
                        nodes,
                    };
                }
                tried.push(format!("{f} holds no version"));
            }
            Err(e) if e.kind() == ErrorKind::PermissionDenied => {
                tried.push(format!("{f} not readable (root only: run as root or sudo)"))
            }
            Err(_) => tried.push(format!("no {f}")),
        }
    }
    match kernel_log_line() {
        Ok(Some(line)) => Driver {
            version: dotted_version(line.split("Initialized").nth(1).unwrap_or("")),
            source: format!("kernel log: {line}"),
            nodes,
        },
        Ok(None) => {
            tried.push("no \"Initialized rknpu\" line in the kernel log".into());
            unknown(tried, nodes)
        }
        Err(e) => {
            tried.push(format!("kernel log not readable ({e})"));
            unknown(tried, nodes)
        }
    }
}

fn unknown(tried: Vec<String>, nodes: String) -> Driver {
    Driver {
        version: None,
        source: format!("looked for: {}", tried.join("; ")),
        nodes,
    }
}

/// The last kernel log message announcing the rknpu driver, read from `/dev/kmsg` (what `dmesg`
/// shows; refused to users without the right when `kernel.dmesg_restrict` is set).
fn kernel_log_line() -> std::io::Result<Option<String>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")?;
    // One record per read; a buffer shorter than a record is an error.
    let mut buf = vec![0u8; 16 << 10];
    let mut found = None;
    for _ in 0..1_000_000 {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let record = String::from_utf8_lossy(&buf[..n]);
                let message = record.split_once(';').map_or(&*record, |(_, m)| m);
                let message = message.lines().next().unwrap_or("").trim();
                let lower = message.to_ascii_lowercase();
                if lower.contains("initialized rknpu") {
                    found = Some(message.to_string());
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            // A record overwritten while reading: go on with the next.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

/// The CPUs this process may run on, grouped by core type, fastest first.
pub fn cpus() -> Cpus {
    ork_moe::cpus::clusters(&allowed_cpus())
}

/// The memory this machine has and how its DRAM is clocked (`/sys/class/devfreq/*dmc*`).
pub fn memory() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    out.push((
        "total".into(),
        total.map_or("unknown".into(), |kb| {
            format!("{:.1} GiB", kb as f64 / (1u64 << 20) as f64)
        }),
    ));
    let dmc = std::fs::read_dir("/sys/class/devfreq")
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().contains("dmc"));
    match dmc {
        None => out.push((
            "dmc".into(),
            "no /sys/class/devfreq/*dmc* (memory clock not exposed)".into(),
        )),
        Some(e) => {
            out.push(("dmc".into(), e.path().display().to_string()));
            for f in [
                "governor",
                "cur_freq",
                "min_freq",
                "max_freq",
                "available_frequencies",
            ] {
                let v = std::fs::read_to_string(e.path().join(f)).map_or_else(
                    |err| format!("not readable ({err})"),
                    |s| s.trim().to_string(),
                );
                out.push((format!("dmc_{f}"), v));
            }
        }
    }
    out
}

/// The board model (`/proc/device-tree/model`) and the kernel release.
pub fn host() -> Vec<(String, String)> {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| {
                s.trim_matches(|c: char| c == '\0' || c.is_whitespace())
                    .to_string()
            })
            .unwrap_or_else(|_| "unknown".into())
    };
    vec![
        ("model".into(), read("/proc/device-tree/model")),
        ("kernel".into(), read("/proc/sys/kernel/osrelease")),
        ("arch".into(), std::env::consts::ARCH.into()),
    ]
}

/// Runs `f` on a new thread pinned to `cpu`.
pub fn on_cpu<R: Send>(cpu: usize, f: impl FnOnce() -> R + Send) -> Result<R, String> {
    std::thread::scope(|s| {
        s.spawn(move || {
            pin(cpu)?;
            Ok(f())
        })
        .join()
        .map_err(|_| format!("the thread measuring on cpu {cpu} panicked"))?
    })
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) -> Result<(), String> {
    ork_moe::pool::pin_current_thread(&[cpu])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_out_of_the_formats_users_see() {
        assert_eq!(
            dotted_version("RKNPU driver: v0.9.8\n").as_deref(),
            Some("0.9.8")
        );
        let drm = "[drm] Initialized rknpu 0.9.8 20240828 for fdab0000.npu on minor 1";
        assert_eq!(
            dotted_version(drm.split("Initialized").nth(1).unwrap()).as_deref(),
            Some("0.9.8")
        );
        assert_eq!(
            dotted_version("Initialized RKNPU driver: v0.9.6 for 20240322").as_deref(),
            Some("0.9.6")
        );
        assert_eq!(dotted_version("no version 1.2 here"), None);
    }

    #[test]
    fn a_pinned_thread_runs_on_its_cpu() {
        let cpu = allowed_cpus()[0];
        // SAFETY: sched_getcpu has no preconditions.
        let on = on_cpu(cpu, || unsafe { libc::sched_getcpu() }).unwrap();
        assert_eq!(on, cpu as i32);
        assert!(!cpus().clusters.is_empty());
    }
}
