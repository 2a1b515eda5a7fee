//! An engine's classes of calls and their verdicts under `ORK_DISPATCH`, shared by its threads.

use super::memory::{Memory, Verdicts};
use super::{Choice, Class, OpClass, Params, Path, Verdict};
use crate::moe::{Dispatch, Plan};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;

/// Seconds of measured calls (both paths) between two saves of the cache file: the first
/// decided verdict is saved at once, later changes at most this often, and whatever is left at
/// the engine's end.
pub const SAVE_EVERY: f64 = 1.0;

/// The verdicts of one engine.
pub struct Table {
    mode: Dispatch,
    params: Params,
    state: Mutex<State>,
    memory: Option<Memory>,
}

#[derive(Default)]
struct State {
    classes: HashMap<OpClass, Class>,
    saving: Saving,
}

/// When the cache file is due to be written.
#[derive(Default)]
pub(super) struct Saving {
    /// A verdict changed after the last save.
    dirty: bool,
    saved_once: bool,
    /// Seconds measured after the last save.
    measured: f64,
}

impl Saving {
    /// Notes a call measured in `seconds` that changed a verdict or not; true when the file is
    /// due, which starts the next interval.
    pub(super) fn due(&mut self, changed: bool, seconds: f64) -> bool {
        if seconds.is_finite() && seconds > 0.0 {
            self.measured += seconds;
        }
        self.dirty |= changed;
        let due = self.dirty && (!self.saved_once || self.measured >= SAVE_EVERY);
        if due {
            *self = Saving {
                dirty: false,
                saved_once: true,
                measured: 0.0,
            };
        }
        due
    }
}

impl Table {
    /// The table of `mode`; under `auto`, starting from the verdicts `memory` remembers, and
    /// saving them there.
    pub fn new(mode: Dispatch, memory: Option<Memory>) -> Table {
        let memory = memory.filter(|_| mode == Dispatch::Auto);
        let mut state = State::default();
        for (class, r) in memory.as_ref().map(Memory::load).unwrap_or_default() {
            let c = Class::remembered(&r);
            log::info!("dispatch: {class}: {} (remembered)", describe(&c.verdict()));
            state.classes.insert(class, c);
        }
        Table {
            mode,
            params: Params::DEFAULT,
            state: Mutex::new(state),
            memory,
        }
    }

    /// The path of the next call of `plan`.
    pub fn choose(&self, plan: &Plan) -> Choice {
        let path = match self.mode {
            Dispatch::Always => Path::Library,
            Dispatch::Never => Path::Ggml,
            Dispatch::Auto => {
                let class = OpClass::of(plan);
                let rows = plan.problem.rows();
                return lock(&self.state)
                    .classes
                    .entry(class)
                    .or_default()
                    .choose(&self.params, rows);
            }
        };
        Choice {
            path,
            explore: false,
        }
    }

    /// A call of `plan` ran on `path` in `seconds` (under `auto` only; ignored otherwise).
    pub fn observe(&self, plan: &Plan, path: Path, seconds: f64) {
        if self.mode != Dispatch::Auto {
            return;
        }
        let class = OpClass::of(plan);
        let to_save = {
            let mut state = lock(&self.state);
            let c = state.classes.entry(class).or_default();
            let before = c.verdict();
            c.observe(&self.params, path, plan.problem.rows(), seconds);
            let after = c.verdict();
            let changed = after.decided && (after.path != before.path || !before.decided);
            if changed {
                log::info!("dispatch: {class}: {}", describe(&after));
            }
            let due = state.saving.due(changed, seconds) && self.memory.is_some();
            due.then(|| remembered(&state.classes))
        };
        if let (Some(memory), Some(verdicts)) = (&self.memory, to_save) {
            memory.save(&verdicts);
        }
    }

    /// Saves the verdicts that changed after the last save (at the engine's end, or the
    /// process's).
    pub fn save_changes(&self) {
        let Some(memory) = &self.memory else { return };
        let verdicts = {
            let mut state = lock(&self.state);
            if !state.saving.dirty {
                return;
            }
            state.saving.dirty = false;
            remembered(&state.classes)
        };
        memory.save(&verdicts);
    }

    /// Every class's verdict, in the classes' order.
    pub fn verdicts(&self) -> Vec<(OpClass, Verdict)> {
        let mut all: Vec<_> = lock(&self.state)
            .classes
            .iter()
            .map(|(class, c)| (*class, c.verdict()))
            .collect();
        all.sort_by_key(|(class, _)| *class);
        all
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        self.save_changes();
    }
}

/// The decided verdicts of `classes`, as the cache file keeps them.
fn remembered(classes: &HashMap<OpClass, Class>) -> Verdicts {
    classes
        .iter()
        .filter_map(|(class, c)| Some((*class, c.to_remember()?)))
        .collect()
}

/// A verdict with both times, µs per row, and both sample counts.
pub fn describe(v: &Verdict) -> String {
    let us = |t: Option<f64>| t.map_or("-".to_owned(), |t| format!("{:.3}", t * 1e6));
    format!(
        "{} (library {} µs/row of {} samples, ggml {} µs/row of {}{})",
        v.path.name(),
        us(v.library),
        v.library_samples,
        us(v.ggml),
        v.ggml_samples,
        if v.decided { "" } else { ", undecided" }
    )
}
