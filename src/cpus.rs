//! The machine's CPUs by core type (the RK3588's four A55s and four A76s), read from
//! `/proc/cpuinfo` and sysfs, and which of them a process left idle: where the library's
//! prefetch threads go by default (`ORK_PREFETCH=auto`) and what the board check reports.
//!
//! Whatever a file does not say is left unknown; nothing here fails.

use std::path::Path;

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

/// CPUs grouped by core type, fastest first.
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

/// `0-3,6` for a sorted list.
pub fn list(cpus: &[usize]) -> String {
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

/// CPUs numbered from here on are beyond what this library pins a thread to (`cpu_set_t`'s
/// 1024 bits, `crate::pool::pin_current_thread`).
pub const CPU_LIMIT: usize = 1024;

/// A CPU list as `taskset -c` and sysfs write it: numbers and ranges, comma-separated (`0-3`,
/// `0,2,4-5`); sorted, without repeats. Its error says what was expected, and why the text is
/// not that.
pub fn parse_list(v: &str) -> Result<Vec<usize>, String> {
    let want = "CPU numbers and ranges, e.g. 0-3 or 0,2,4-5";
    let mut cpus = Vec::new();
    for part in v.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (
            a.trim().parse().map_err(|_| want)?,
            b.trim().parse().map_err(|_| want)?,
        );
        if b >= CPU_LIMIT {
            return Err(format!(
                "CPU numbers below {CPU_LIMIT}, the most a thread is pinned to ({b} is beyond)"
            ));
        }
        if a > b {
            return Err(format!(
                "ranges from the lower CPU number to the higher ({a}-{b} runs downwards)"
            ));
        }
        cpus.extend(a..=b);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
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

/// What one CPU's sysfs directory says of its speed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Speed {
    capacity: Option<u32>,
    max_mhz: Option<u32>,
}

fn read_u32(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn speed(cpu: usize) -> Speed {
    let dir = Path::new("/sys/devices/system/cpu").join(format!("cpu{cpu}"));
    Speed {
        capacity: read_u32(&dir.join("cpu_capacity")),
        max_mhz: read_u32(&dir.join("cpufreq/cpuinfo_max_freq")).map(|khz| khz / 1000),
    }
}

/// What makes two CPUs one core type.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Part(String),
    Speed(Speed),
}

/// Groups `cpus` by core type (the `CPU part`, else the capacity and top frequency), fastest
/// type first.
fn group(cpus: &[usize], info: &[Info], speed: impl Fn(usize) -> Speed) -> Cpus {
    let mut kinds: Vec<(Kind, Cluster)> = Vec::new();
    for &cpu in cpus {
        let s = speed(cpu);
        let info = info.iter().find(|i| i.cpu == cpu);
        let kind = match info {
            Some(i) if i.is_part => Kind::Part(i.name.clone()),
            _ => Kind::Speed(s),
        };
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            // Two clusters of one core type (the RK3588's A76 pairs) may top out differently.
            Some((_, c)) => {
                c.cpus.push(cpu);
                c.capacity = c.capacity.max(s.capacity);
                c.max_mhz = c.max_mhz.max(s.max_mhz);
            }
            None => kinds.push((
                kind,
                Cluster {
                    cpus: vec![cpu],
                    capacity: s.capacity,
                    max_mhz: s.max_mhz,
                    part: info.map(|i| i.name.clone()),
                },
            )),
        }
    }
    let mut clusters: Vec<Cluster> = kinds.into_iter().map(|(_, c)| c).collect();
    clusters.sort_by_key(|c| std::cmp::Reverse((c.capacity, c.max_mhz)));
    Cpus { clusters }
}

/// `cpus` grouped by core type, fastest first.
pub fn clusters(cpus: &[usize]) -> Cpus {
    let info = parts(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
    group(cpus, &info, speed)
}

/// The CPUs the kernel has online (`/sys/devices/system/cpu/online`), else those this thread
/// may run on.
pub fn online() -> Vec<usize> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_list(&s).ok())
        .unwrap_or_else(crate::pool::allowed_cpus)
}

/// The CPUs of the slowest core type when the calling thread may run on none of them: cores
/// the host kept its own threads off (on the RK3588, `taskset -c 4-7` leaves the A55s idle),
/// where prefetch threads take nothing from it. Otherwise why not, for the log.
pub fn idle_slow_cores() -> Result<Vec<usize>, String> {
    pick_idle_slow(&clusters(&online()), &crate::pool::allowed_cpus())
}

/// [`idle_slow_cores`] of the machine `machine` describes, for a process allowed on `allowed`.
pub(crate) fn pick_idle_slow(machine: &Cpus, allowed: &[usize]) -> Result<Vec<usize>, String> {
    let Some(little) = machine.little() else {
        return Err(match machine.clusters.first() {
            Some(only) => format!("one core type ({})", only.describe()),
            None => "no CPUs listed".into(),
        });
    };
    if little.cpus.iter().any(|c| allowed.contains(c)) {
        return Err(format!(
            "this process may run on the slowest cores, {} (allowed: cpu {})",
            little.describe(),
            list(allowed)
        ));
    }
    Ok(little.cpus.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RK3588: &str =
        "processor\t: 0\nCPU part\t: 0xd05\n\nprocessor\t: 1\nCPU part\t: 0xd05\n\n\
        processor\t: 2\nCPU part\t: 0xd05\n\nprocessor\t: 3\nCPU part\t: 0xd05\n\n\
        processor\t: 4\nCPU part\t: 0xd0b\n\nprocessor\t: 5\nCPU part\t: 0xd0b\n\n\
        processor\t: 6\nCPU part\t: 0xd0b\n\nprocessor\t: 7\nCPU part\t: 0xd0b\n";

    /// The RK3588's sysfs: A55s at capacity 530 and 1800 MHz, the two A76 pairs at 1024 and
    /// 2256 / 2304 MHz.
    fn rk3588_speed(cpu: usize) -> Speed {
        let (capacity, max_mhz) = match cpu {
            0..=3 => (530, 1800),
            4 | 5 => (1024, 2256),
            _ => (1024, 2304),
        };
        Speed {
            capacity: Some(capacity),
            max_mhz: Some(max_mhz),
        }
    }

    #[test]
    fn cpuinfo_names_the_core_types() {
        let names: Vec<(usize, String, bool)> = parts(RK3588)
            .into_iter()
            .map(|i| (i.cpu, i.name, i.is_part))
            .filter(|i| i.0 % 4 == 0)
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
        assert_eq!(parse_list("0-3,6\n"), Ok(vec![0, 1, 2, 3, 6]));
    }

    #[test]
    fn a_bad_cpu_list_says_what_is_wrong_with_it() {
        for (text, says) in [
            (
                "4000",
                "below 1024, the most a thread is pinned to (4000 is beyond)",
            ),
            ("0-1024", "(1024 is beyond)"),
            ("3-1", "(3-1 runs downwards)"),
            ("a", "CPU numbers and ranges"),
            ("0,,1", "CPU numbers and ranges"),
        ] {
            let e = parse_list(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert_eq!(parse_list("1023"), Ok(vec![1023]));
    }

    #[test]
    fn the_rk3588_has_two_core_types_fastest_first() {
        let all: Vec<usize> = (0..8).collect();
        let cpus = group(&all, &parts(RK3588), rk3588_speed);
        assert_eq!(cpus.clusters.len(), 2);
        assert_eq!(cpus.big().cpus, vec![4, 5, 6, 7]);
        assert_eq!(cpus.big().max_mhz, Some(2304));
        assert_eq!(cpus.little().unwrap().cpus, vec![0, 1, 2, 3]);
        assert_eq!(cpus.all(), all);
    }

    #[test]
    fn prefetch_cores_are_the_slow_ones_a_process_left_alone() {
        let all: Vec<usize> = (0..8).collect();
        let board = group(&all, &parts(RK3588), rk3588_speed);
        // docs/BOARD.md's `taskset -c 4-7`: the A55s are idle.
        assert_eq!(pick_idle_slow(&board, &[4, 5, 6, 7]), Ok(vec![0, 1, 2, 3]));
        // llama.cpp's default of 8 threads on all cores, or any share of the A55s: none.
        assert!(pick_idle_slow(&board, &all).is_err());
        assert!(pick_idle_slow(&board, &[3, 4, 5, 6, 7]).is_err());
        // One core type (this x86 box, or a board's kernel exposing nothing): none.
        let same = group(&[0, 1], &[], |_| Speed::default());
        assert!(pick_idle_slow(&same, &[0]).is_err());
        assert!(pick_idle_slow(&group(&[], &[], |_| Speed::default()), &[0]).is_err());
    }

    #[test]
    fn this_machine_groups_every_online_cpu() {
        let online = online();
        assert!(!online.is_empty());
        assert_eq!(clusters(&online).all(), online);
    }
}
