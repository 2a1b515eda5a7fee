//! Injected device faults: the emulator can be told, as data in its [`Config`](super::Config),
//! to fail chosen operations, so that what a failing allocation, submit or cache sync, or a full
//! IOMMU domain, does to a call can be tested.
//!
//! Operations are counted from 1, per kind, from the emulator's creation, over every thread.
//! The spec `alloc:3,run:5+,sync_from_device:2` fails the 3rd buffer allocation, the 5th submit
//! and every later one, and the 2nd sync from the device.

use crate::npu::error::{Error, Result};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// An operation that can be made to fail, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// A buffer allocation fails as a driver error ([`Error::Device`]).
    Alloc,
    /// A buffer allocation finds its IOMMU domain full ([`Error::OutOfMemory`], 0 bytes free).
    /// Counts allocations, like `Alloc`.
    DomainFull,
    /// A submit fails: its shares compute nothing, its output buffer holds garbage on the
    /// device side, and finishing it returns [`Error::Device`].
    Run,
    /// A cache flush (`sync_to_device`) fails with [`Error::Device`] and flushes nothing.
    SyncToDevice,
    /// A cache invalidate (`sync_from_device`) fails with [`Error::Device`]; the CPU view stays
    /// as it was.
    SyncFromDevice,
}

impl FaultOp {
    const ALL: [FaultOp; 5] = [
        FaultOp::Alloc,
        FaultOp::DomainFull,
        FaultOp::Run,
        FaultOp::SyncToDevice,
        FaultOp::SyncFromDevice,
    ];

    /// The word of the spec.
    pub fn name(self) -> &'static str {
        match self {
            FaultOp::Alloc => "alloc",
            FaultOp::DomainFull => "domain_full",
            FaultOp::Run => "run",
            FaultOp::SyncToDevice => "sync_to_device",
            FaultOp::SyncFromDevice => "sync_from_device",
        }
    }

    /// Index of the operation counter this kind counts.
    fn counter(self) -> usize {
        match self {
            FaultOp::Alloc | FaultOp::DomainFull => 0,
            FaultOp::Run => 1,
            FaultOp::SyncToDevice => 2,
            FaultOp::SyncFromDevice => 3,
        }
    }
}

/// One fault: the `nth` operation of its kind fails, and with `onwards` every later one too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub op: FaultOp,
    pub nth: u64,
    pub onwards: bool,
}

impl Fault {
    fn hits(&self, n: u64) -> bool {
        n == self.nth || (self.onwards && n > self.nth)
    }
}

/// The faults to inject (none by default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan(pub Vec<Fault>);

impl FaultPlan {
    /// Parses `op:N` or `op:N+` items separated by commas (`N` ≥ 1, `+`: from the N-th on), with
    /// `op` one of `alloc`, `domain_full`, `run`, `sync_to_device`, `sync_from_device`. The empty
    /// string is no faults.
    pub fn parse(spec: &str) -> std::result::Result<FaultPlan, String> {
        let mut faults = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let bad = || {
                format!(
                    "fault {item:?}: expected op:N or op:N+ with N >= 1 and op one of {}",
                    FaultOp::ALL.map(FaultOp::name).join(", ")
                )
            };
            let (name, count) = item.split_once(':').ok_or_else(bad)?;
            let op = FaultOp::ALL
                .into_iter()
                .find(|op| op.name().eq_ignore_ascii_case(name.trim()))
                .ok_or_else(bad)?;
            let count = count.trim();
            let (count, onwards) = match count.strip_suffix('+') {
                Some(c) => (c, true),
                None => (count, false),
            };
            let nth = count
                .parse::<u64>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(bad)?;
            faults.push(Fault { op, nth, onwards });
        }
        Ok(FaultPlan(faults))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, x) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let plus = if x.onwards { "+" } else { "" };
            write!(f, "{sep}{}:{}{plus}", x.op.name(), x.nth)?;
        }
        Ok(())
    }
}

/// How many operations of each counted kind happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub allocs: u64,
    pub runs: u64,
    pub syncs_to_device: u64,
    pub syncs_from_device: u64,
    /// Operations made to fail.
    pub injected: u64,
}

/// The plan and the operation counters of one emulator.
#[derive(Debug, Default)]
pub(super) struct Faults {
    plan: FaultPlan,
    counts: [AtomicU64; 4],
    injected: AtomicU64,
}

impl Faults {
    pub(super) fn new(plan: FaultPlan) -> Faults {
        Faults {
            plan,
            ..Faults::default()
        }
    }

    /// Counts one operation of `op`'s counter and returns the fault it must raise, if any:
    /// `kinds` are the fault kinds that apply to it (an allocation can fail either way).
    fn count(&self, kinds: &[FaultOp]) -> Option<(FaultOp, u64)> {
        let n = self.counts[kinds[0].counter()].fetch_add(1, Ordering::Relaxed) + 1;
        let hit = self
            .plan
            .0
            .iter()
            .find(|f| kinds.contains(&f.op) && f.hits(n))?;
        self.injected.fetch_add(1, Ordering::Relaxed);
        Some((hit.op, n))
    }

    /// Counts an allocation of `bytes` in `domain`: Err if it is to fail.
    pub(super) fn alloc(&self, domain: u32, bytes: u64) -> Result<()> {
        match self.count(&[FaultOp::Alloc, FaultOp::DomainFull]) {
            None => Ok(()),
            Some((FaultOp::DomainFull, _)) => Err(Error::OutOfMemory {
                domain,
                requested: bytes,
                available: 0,
            }),
            Some((_, n)) => Err(Error::Device(format!(
                "injected fault: allocation {n} failed"
            ))),
        }
    }

    /// Counts a submit, or a sync: `Some(message)` if it is to fail.
    pub(super) fn fails(&self, op: FaultOp) -> Option<String> {
        self.count(&[op])
            .map(|(op, n)| format!("injected fault: {} {n} failed", op.name()))
    }

    pub(super) fn counts(&self) -> OpCounts {
        let c = self.counts.each_ref().map(|a| a.load(Ordering::Relaxed));
        OpCounts {
            allocs: c[0],
            runs: c[1],
            syncs_to_device: c[2],
            syncs_from_device: c[3],
            injected: self.injected.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let p = FaultPlan::parse(" alloc:3, run:5+ ,SYNC_FROM_DEVICE:2,domain_full:1").unwrap();
        assert_eq!(
            p.to_string(),
            "alloc:3,run:5+,sync_from_device:2,domain_full:1"
        );
        assert_eq!(FaultPlan::parse(&p.to_string()).unwrap(), p);
        assert!(FaultPlan::parse("").unwrap().is_empty());
        for bad in [
            "alloc",
            "alloc:0",
            "alloc:x",
            "context:1",
            "run:-1",
            "run:2++",
        ] {
            let e = FaultPlan::parse(bad).unwrap_err();
            assert!(e.contains("expected op:N"), "{bad}: {e}");
        }
    }

    #[test]
    fn nth_and_onwards_count_per_kind() {
        let f = Faults::new(FaultPlan::parse("alloc:2,domain_full:4+,run:1").unwrap());
        let allocs: Vec<_> = (0..5).map(|_| f.alloc(3, 4096)).collect();
        assert!(allocs[0].is_ok() && allocs[2].is_ok());
        assert!(matches!(&allocs[1], Err(Error::Device(m)) if m.contains("allocation 2")));
        for a in &allocs[3..] {
            assert_eq!(
                a,
                &Err(Error::OutOfMemory {
                    domain: 3,
                    requested: 4096,
                    available: 0
                })
            );
        }
        assert_eq!(f.fails(FaultOp::SyncToDevice), None);
        assert!(f.fails(FaultOp::Run).unwrap().contains("run 1"));
        assert_eq!(f.fails(FaultOp::Run), None);
        let c = f.counts();
        assert_eq!(
            (c.allocs, c.runs, c.syncs_to_device, c.injected),
            (5, 2, 1, 4)
        );
    }
}
