//! What the board check reports of the machine (the rknpu driver, the CPU clusters, the memory
//! setup) and how it pins a measuring thread to one CPU.
//!
//! Everything is read from files a user can also read by hand (docs/BOARD.md section 1), and
//! whatever is missing is reported as unknown, with where it was looked for.

use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

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

/// CPUs of one core type.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub cpus: Vec<usize>,
    /// `cpu_capacity` (1024 = the fastest core), where the kernel exposes it.
    pub capacity: Option<u32>,
    pub max_mhz: Option<u32>,
    /// `Cortex-A76`, `CPU part 0xd0b`, or the x86 model name.
    pub part: Option<String>,
}

impl Cluster {
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} x {} (cpu {})",
            self.cpus.len(),
            self.part.as_deref().unwrap_or("?"),
            list(&self.cpus)
        );
        if let Some(c) = self.capacity {
            s += &format!(", capacity {c}");
        }
        if let Some(f) = self.max_mhz {
            s += &format!(", up to {f} MHz");
        }
        s
    }
}

/// The CPUs this process may run on, grouped by core type, fastest first.
#[derive(Clone, Debug)]
pub struct Cpus {
    pub clusters: Vec<Cluster>,
}

impl Cpus {
    /// The fastest core type.
    pub fn big(&self) -> &Cluster {
        &self.clusters[0]
    }

    /// The slowest core type, if there is more than one.
    pub fn little(&self) -> Option<&Cluster> {
        (self.clusters.len() > 1).then(|| &self.clusters[self.clusters.len() - 1])
    }

    pub fn all(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.clusters.iter().flat_map(|c| c.cpus.clone()).collect();
        v.sort_unstable();
        v
    }
}

/// `0-3,6`.
fn list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Names of Arm core types by `CPU part`.
fn arm_part(part: &str) -> String {
    match part {
        "0xd0b" => "Cortex-A76".into(),
        "0xd05" => "Cortex-A55".into(),
        "0xd08" => "Cortex-A72".into(),
        "0xd03" => "Cortex-A53".into(),
        "0xd0d" => "Cortex-A77".into(),
        "0xd41" => "Cortex-A78".into(),
        other => format!("CPU part {other}"),
    }
}

/// What /proc/cpuinfo says of one processor: its `CPU part` (Arm: the core type) or its `model
/// name` (x86: the same for every core, even of a hybrid CPU).
#[derive(Clone, Debug, PartialEq)]
struct Info {
    cpu: usize,
    name: String,
    is_part: bool,
}

fn parts(cpuinfo: &str) -> Vec<Info> {
    let mut out = Vec::new();
    for block in cpuinfo.split("\n\n") {
        let field = |name: &str| {
            block.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        let Some(cpu) = field("processor").and_then(|p| p.parse().ok()) else {
            continue;
        };
        if let Some(p) = field("CPU part") {
            out.push(Info {
                cpu,
                name: arm_part(&p),
                is_part: true,
            });
        } else if let Some(m) = field("model name") {
            out.push(Info {
                cpu,
                name: m,
                is_part: false,
            });
        }
    }
    out
}

fn read_u32(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What makes two CPUs one core type.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Part(String),
    Speed(Option<u32>, Option<u32>),
}

/// Groups the CPUs this process may run on by core type (the `CPU part`, else the capacity and
/// top frequency), fastest type first.
pub fn cpus() -> Cpus {
    let sys = Path::new("/sys/devices/system/cpu");
    let info = parts(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
    let mut kinds: Vec<(Kind, Cluster)> = Vec::new();
    for cpu in allowed_cpus() {
        let dir = sys.join(format!("cpu{cpu}"));
        let capacity = read_u32(&dir.join("cpu_capacity"));
        let max_mhz = read_u32(&dir.join("cpufreq/cpuinfo_max_freq")).map(|khz| khz / 1000);
        let info = info.iter().find(|i| i.cpu == cpu);
        let kind = match info {
            Some(i) if i.is_part => Kind::Part(i.name.clone()),
            _ => Kind::Speed(capacity, max_mhz),
        };
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            // Two clusters of one core type (the RK3588's A76 pairs) may top out differently.
            Some((_, c)) => {
                c.cpus.push(cpu);
                c.capacity = c.capacity.max(capacity);
                c.max_mhz = c.max_mhz.max(max_mhz);
            }
            None => kinds.push((
                kind,
                Cluster {
                    cpus: vec![cpu],
                    capacity,
                    max_mhz,
                    part: info.map(|i| i.name.clone()),
                },
            )),
        }
    }
    let mut clusters: Vec<Cluster> = kinds.into_iter().map(|(_, c)| c).collect();
    clusters.sort_by_key(|c| std::cmp::Reverse((c.capacity, c.max_mhz)));
    Cpus { clusters }
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

/// The CPUs this process may run on (`taskset` narrows them).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits (all-zero is the empty set); sched_getaffinity writes at most
    // the size given; CPU_ISSET reads bits below CPU_SETSIZE of that set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            return (0..n).collect();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
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
    fn cpuinfo_names_the_core_types() {
        let arm = "processor\t: 0\nCPU part\t: 0xd05\n\nprocessor\t: 4\nCPU part\t: 0xd0b\n";
        let names: Vec<(usize, String, bool)> = parts(arm)
            .into_iter()
            .map(|i| (i.cpu, i.name, i.is_part))
            .collect();
        assert_eq!(
            names,
            vec![
                (0, "Cortex-A55".into(), true),
                (4, "Cortex-A76".into(), true)
            ]
        );
        let x86 =
            "processor\t: 0\nmodel name\t: Some CPU\n\nprocessor\t: 1\nmodel name\t: Some CPU\n";
        assert!(parts(x86)
            .iter()
            .all(|i| !i.is_part && i.name == "Some CPU"));
        assert_eq!(list(&[0, 1, 2, 3, 6]), "0-3,6");
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
