//! `ork-probe model --svg`: the modelled time per layer of each case, as stacked bars.

use super::{ms, Case};
use crate::svg::bars::{self, Bar, Panel};
use ork_probe::timeline::{Stage, Timeline};

/// Per layer of the last ubatch of each case: the engine's expert part stacked by stage (serial)
/// on the dense part's wall time, the engine's as-scheduled span, with its prefetch threads, and
/// pipelined.
pub fn svg(cases: &[Case]) -> String {
    let panels: Vec<Panel> = cases
        .iter()
        .map(|c| {
            let u = c.ubatches.last().expect("at least one ubatch");
            let experts = &u.models[0].experts;
            let [engine, piped, ahead] = [0, 1, 3].map(|i| &u.models[i].whole);
            let dense_ms = ms(c.dense_us) / c.shape.layers as f64;
            let span = |t: &Timeline, l: usize| {
                let before = if l == 0 { 0.0 } else { t.layer_end_us[l - 1] };
                ms(t.layer_end_us[l] - before)
            };
            let groups = (0..c.shape.layers)
                .map(|l| {
                    let mut segments = vec![("dense (wall)".to_string(), dense_ms)];
                    segments.extend(
                        Stage::REPORTED
                            .iter()
                            .zip(&experts.layer_stage_us[l])
                            .filter(|(s, _)| **s != Stage::Dense)
                            .map(|(s, &v)| (s.name().to_string(), ms(v))),
                    );
                    let serial = Bar { segments };
                    let one = |name: &str, v: f64| Bar {
                        segments: vec![(name.to_string(), v)],
                    };
                    vec![
                        serial,
                        one("engine, as scheduled", span(engine, l)),
                        one("engine+prefetch, as scheduled", span(ahead, l)),
                        one("pipelined, as scheduled", span(piped, l)),
                    ]
                })
                .collect();
            Panel {
                title: format!(
                    "{} {} ub{}: per layer, dense + the engine's expert stages serial | engine as scheduled | +prefetch | pipelined",
                    c.shape.name,
                    c.ty.name(),
                    c.tokens
                ),
                groups,
            }
        })
        .collect();
    bars::render(
        "ork-probe model: modelled RK3588 time per layer (ms), dense part included",
        "layer",
        "ms",
        &panels,
        1400.0,
    )
}
