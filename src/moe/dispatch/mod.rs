//! Measured dispatch: for each class of op, whether the library's path or ggml's own path runs
//! it, from the times both paths took on that class.
//!
//! A class keeps an estimate per path (the fastest of its recent times per row), takes the
//! library's path only while it is faster than ggml's by a margin (and leaves it only when that
//! lead shrinks below a smaller one: hysteresis), and spends a bounded share of the class's time
//! on the path it does not take, one call at a time, to notice when the verdict should change
//! (heat, another process on the NPU). No clock is read here: times come in as samples, and
//! "over time" is counted in calls.

pub mod memory;
mod op_class;
mod table;
#[cfg(test)]
mod tests;

pub use memory::Memory;
pub use op_class::{Kind, OpClass};
pub use table::{describe, Table};

/// The two ways an op can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// The library takes the op.
    Library,
    /// The library declines it: ggml runs its own path.
    Ggml,
}

impl Path {
    fn other(self) -> Path {
        match self {
            Path::Library => Path::Ggml,
            Path::Ggml => Path::Library,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Path::Library => "library",
            Path::Ggml => "ggml",
        }
    }

    pub fn from_name(name: &str) -> Option<Path> {
        [Path::Library, Path::Ggml]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// What one call of a class does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub path: Path,
    /// The call runs the path the class does not take, to measure it.
    pub explore: bool,
}

/// The rule's constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// The library's path is taken when its time per row is at most `1 - take_margin` of ggml's.
    pub take_margin: f64,
    /// ... and kept while it stays below `1 - keep_margin` of ggml's (`keep_margin < take_margin`).
    pub keep_margin: f64,
    /// Most of a class's measured time that may go to the path it does not take, once both
    /// paths have their first samples.
    pub budget: f64,
    /// Samples per path before the class is decided; the library's path runs until it has them.
    pub first_samples: usize,
    /// The library's first calls of a class that give no sample: they fill the inflated-expert
    /// cache and create the device contexts later calls reuse, so they take several times as
    /// long as the calls after them.
    pub library_warm_up: usize,
    /// Calls after which an exploration whose time never came back is given up.
    pub pending_calls: u64,
    /// Explorations of a path given up in a row after which the path is taken as one that is
    /// never measured (a ggml that does not report): the class then keeps its verdict.
    pub unanswered: u32,
}

impl Params {
    pub const DEFAULT: Params = Params {
        take_margin: 0.05,
        keep_margin: 0.02,
        budget: 0.03,
        first_samples: 2,
        library_warm_up: 2,
        pending_calls: 16,
        unanswered: 3,
    };
}

/// Samples kept per path. The estimate is the fastest of them: what disturbs a measured call
/// (a thread the scheduler set aside, page faults, the setup a class's first call does for the
/// ones after it) only ever adds time, so the fastest recent call is the closest to what the path
/// costs, however many of its neighbours were disturbed; and since only recent calls count, a path
/// that gets slower for good (heat, another process on the NPU) shows it within a window.
const WINDOW: usize = 5;

/// The recent times per row of one path of one class.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Estimate {
    recent: [f64; WINDOW],
    len: usize,
    next: usize,
    /// Samples ever seen.
    count: u64,
}

impl Estimate {
    fn push(&mut self, per_row: f64) {
        self.recent[self.next] = per_row;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
        self.count += 1;
    }

    /// The fastest of the recent samples, seconds per row.
    pub fn fastest(&self) -> Option<f64> {
        self.recent[..self.len].iter().copied().reduce(f64::min)
    }
}

/// An exploration handed out and not yet measured.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pending {
    path: Path,
    /// The call (by count) it was handed to.
    call: u64,
}

/// What a class has measured and decided, for logs, statistics and the cache file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub path: Path,
    /// Both paths measured enough to decide.
    pub decided: bool,
    /// The estimates, seconds per row.
    pub library: Option<f64>,
    pub ggml: Option<f64>,
    /// Samples each path ever gave (counting those of a remembered verdict).
    pub library_samples: u64,
    pub ggml_samples: u64,
    /// Times the verdict changed after it was first decided.
    pub flips: u32,
}

/// A decided verdict as the cache file keeps it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Remembered {
    pub path: Path,
    /// The estimates, seconds per row.
    pub library: f64,
    pub ggml: f64,
    pub library_samples: u64,
    pub ggml_samples: u64,
}

/// One class's measurements and verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    library: Estimate,
    ggml: Estimate,
    path: Path,
    decided: bool,
    flips: u32,
    /// Seconds measured on the class, on both paths, and the part of them spent exploring.
    total: f64,
    explored: f64,
    calls: u64,
    pending: Option<Pending>,
    /// Explorations of ggml's path given up in a row.
    unanswered: u32,
    /// The library's calls of this class that gave no sample ([`Params::library_warm_up`]).
    library_warmed: usize,
}

impl Default for Class {
    fn default() -> Class {
        Class {
            library: Estimate::default(),
            ggml: Estimate::default(),
            path: Path::Library,
            decided: false,
            flips: 0,
            total: 0.0,
            explored: 0.0,
            calls: 0,
            pending: None,
            unanswered: 0,
            library_warmed: 0,
        }
    }
}

impl Class {
    /// A class that starts from a remembered verdict (the cache file): decided, each path's
    /// estimate one sample of its remembered time, its count the remembered one.
    pub fn remembered(r: &Remembered) -> Class {
        let mut c = Class {
            path: r.path,
            decided: true,
            library_warmed: usize::MAX,
            ..Class::default()
        };
        c.library.push(r.library);
        c.ggml.push(r.ggml);
        c.library.count = r.library_samples.max(1);
        c.ggml.count = r.ggml_samples.max(1);
        c
    }

    /// The verdict to remember, once decided on both paths' times.
    pub fn to_remember(&self) -> Option<Remembered> {
        let v = self.verdict();
        Some(Remembered {
            path: v.path,
            library: v.library?,
            ggml: v.ggml?,
            library_samples: v.library_samples,
            ggml_samples: v.ggml_samples,
        })
        .filter(|_| v.decided)
    }

    /// The path the next call of `rows` rows takes.
    pub fn choose(&mut self, p: &Params, rows: usize) -> Choice {
        self.calls += 1;
        self.expire(p);
        let take = Choice {
            path: self.path,
            explore: false,
        };
        if self.pending.is_some() || self.gave_up(p) {
            return take;
        }
        let loser = self.path.other();
        let warming = !self.decided && self.estimate(loser).count < p.first_samples as u64;
        if warming || (self.decided && self.within_budget(p, loser, rows)) {
            self.pending = Some(Pending {
                path: loser,
                call: self.calls,
            });
            return Choice {
                path: loser,
                explore: true,
            };
        }
        take
    }

    /// A call of `rows` rows ran on `path` in `seconds`.
    pub fn observe(&mut self, p: &Params, path: Path, rows: usize, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        self.total += seconds;
        if path != self.path {
            self.explored += seconds;
        }
        if self.pending.is_some_and(|x| x.path == path) {
            self.pending = None;
        }
        if path == Path::Ggml {
            self.unanswered = 0;
        }
        if path == Path::Library && self.library_warmed < p.library_warm_up {
            self.library_warmed += 1;
            return;
        }
        self.estimate_mut(path).push(seconds / rows.max(1) as f64);
        self.decide(p);
    }

    pub fn verdict(&self) -> Verdict {
        Verdict {
            path: self.path,
            decided: self.decided,
            library: self.library.fastest(),
            ggml: self.ggml.fastest(),
            library_samples: self.library.count,
            ggml_samples: self.ggml.count,
            flips: self.flips,
        }
    }

    /// Share of the measured time spent on the path not taken.
    #[cfg(test)]
    pub fn explored_share(&self) -> f64 {
        if self.total > 0.0 {
            self.explored / self.total
        } else {
            0.0
        }
    }

    fn estimate(&self, path: Path) -> &Estimate {
        match path {
            Path::Library => &self.library,
            Path::Ggml => &self.ggml,
        }
    }

    fn estimate_mut(&mut self, path: Path) -> &mut Estimate {
        match path {
            Path::Library => &mut self.library,
            Path::Ggml => &mut self.ggml,
        }
    }

    /// Gives up an exploration whose time has not come back in `pending_calls` calls.
    fn expire(&mut self, p: &Params) {
        let Some(x) = self.pending else { return };
        if self.calls - x.call > p.pending_calls {
            self.pending = None;
            if x.path == Path::Ggml {
                self.unanswered += 1;
            }
        }
    }

    /// ggml's path is never measured (its times never come back): nothing to explore.
    fn gave_up(&self, p: &Params) -> bool {
        self.unanswered >= p.unanswered
    }

    /// Whether one call of `rows` rows on `loser` keeps the explored share within the budget.
    fn within_budget(&self, p: &Params, loser: Path, rows: usize) -> bool {
        let Some(per_row) = self.estimate(loser).fastest() else {
            return true;
        };
        let cost = per_row * rows.max(1) as f64;
        self.explored + cost <= p.budget * (self.total + cost)
    }

    /// The verdict from both estimates, with hysteresis once decided.
    fn decide(&mut self, p: &Params) {
        let enough = |e: &Estimate| e.count >= p.first_samples as u64;
        let measured = enough(&self.library) && enough(&self.ggml);
        if !(self.decided || measured) {
            return;
        }
        let (Some(lib), Some(ggml)) = (self.library.fastest(), self.ggml.fastest()) else {
            return;
        };
        let margin = if self.decided && self.path == Path::Library {
            p.keep_margin
        } else {
            p.take_margin
        };
        let path = if lib <= ggml * (1.0 - margin) {
            Path::Library
        } else {
            Path::Ggml
        };
        if self.decided && path != self.path {
            self.flips += 1;
        }
        self.path = path;
        self.decided = true;
    }
}
