//! `ork-probe model --svg`: the modelled time per layer, and the stacked bar chart it is drawn
//! as: per panel, groups of bars (one group per layer), each bar a stack of named segments on a
//! linear axis. Like `svg.rs`, a few hundred elements that do not need a plotting crate.

use super::{ms, Case};
use crate::svg::{escape, start};
use ork_probe::timeline::{Stage, Timeline};
use std::fmt::Write;

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
    render(
        "ork-probe model: modelled RK3588 time per layer (ms), dense part included",
        "layer",
        "ms",
        &panels,
        1400.0,
    )
}

pub struct Bar {
    /// Segments bottom up: (name, value). A bar with one unnamed-looking segment is a span.
    pub segments: Vec<(String, f64)>,
}

pub struct Panel {
    pub title: String,
    /// One group of bars per x position.
    pub groups: Vec<Vec<Bar>>,
}

const COLORS: [&str; 16] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#000000", "#e6550d", "#843c39", "#7b4173",
];
const PANEL_H: f64 = 300.0;
const MARGIN_L: f64 = 64.0;
const MARGIN_R: f64 = 12.0;
const MARGIN_T: f64 = 30.0;
const MARGIN_B: f64 = 34.0;

/// A round axis step giving about five ticks up to `max`.
fn step(max: f64) -> f64 {
    let raw = (max / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag)
}

/// Renders `panels` one above the other, `width` wide, under `title`; `x_label` names a group,
/// `y_label` the axis.
pub fn render(title: &str, x_label: &str, y_label: &str, panels: &[Panel], width: f64) -> String {
    let legend_h = 40.0;
    let h = 40.0 + PANEL_H * panels.len() as f64 + legend_h;
    let mut s = start(width, h, title);
    let mut names: Vec<&str> = Vec::new();
    for p in panels {
        for b in p.groups.iter().flatten() {
            for (n, _) in &b.segments {
                if !names.contains(&n.as_str()) {
                    names.push(n);
                }
            }
        }
    }
    let color = |n: &str| COLORS[names.iter().position(|x| *x == n).unwrap_or(0) % COLORS.len()];
    for (pi, p) in panels.iter().enumerate() {
        let oy = 40.0 + pi as f64 * PANEL_H;
        let (pw, ph) = (width - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B);
        let max = p
            .groups
            .iter()
            .flatten()
            .map(|b| b.segments.iter().map(|x| x.1).sum::<f64>())
            .fold(0.0, f64::max);
        let tick = step(max);
        let top = (max / tick).ceil().max(1.0) * tick;
        let py = |v: f64| oy + MARGIN_T + ph - v / top * ph;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="12">{}</text>"#,
            MARGIN_L + pw / 2.0,
            oy + 18.0,
            escape(&p.title)
        );
        let mut v = 0.0;
        while v <= top * (1.0 + 1e-9) {
            let y = py(v);
            let _ = writeln!(
                s,
                r##"<line x1="{MARGIN_L}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##,
                MARGIN_L + pw
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                MARGIN_L - 4.0,
                y + 4.0,
                format_tick(v)
            );
            v += tick;
        }
        let _ = writeln!(
            s,
            r#"<text transform="translate(14,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            oy + MARGIN_T + ph / 2.0,
            escape(y_label)
        );
        let groups = p.groups.len().max(1);
        let gw = pw / groups as f64;
        for (gi, group) in p.groups.iter().enumerate() {
            let bars = group.len().max(1);
            let bw = gw * 0.8 / bars as f64;
            let gx = MARGIN_L + gi as f64 * gw + gw * 0.1;
            for (bi, bar) in group.iter().enumerate() {
                let x = gx + bi as f64 * bw;
                let mut base = 0.0;
                for (name, val) in &bar.segments {
                    if *val <= 0.0 {
                        continue;
                    }
                    let (y0, y1) = (py(base), py(base + val));
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x:.2}" y="{y1:.2}" width="{:.2}" height="{:.2}" fill="{}"/>"#,
                        bw * 0.92,
                        y0 - y1,
                        color(name)
                    );
                    base += val;
                }
            }
            if groups <= 16 || gi % 4 == 0 {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{gi}</text>"#,
                    gx + gw * 0.4,
                    oy + MARGIN_T + ph + 13.0
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            MARGIN_L + pw / 2.0,
            oy + PANEL_H - 6.0,
            escape(x_label)
        );
    }
    let (mut lx, mut ly) = (16.0, h - legend_h + 14.0);
    for n in &names {
        let w = 26.0 + 6.5 * n.len() as f64;
        if lx + w > width {
            lx = 16.0;
            ly += 16.0;
        }
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="12" height="10" fill="{}"/>"#,
            ly - 9.0,
            color(n)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{ly}">{}</text>"#,
            lx + 16.0,
            escape(n)
        );
        lx += w;
    }
    s.push_str("</svg>\n");
    s
}

fn format_tick(v: f64) -> String {
    if v >= 1000.0 {
        let k = v / 1000.0;
        if k.fract() == 0.0 {
            format!("{k:.0}k")
        } else {
            format!("{k:.1}k")
        }
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_stacks_and_a_legend() {
        let bar = |a: f64, b: f64| Bar {
            segments: vec![("inflate".into(), a), ("npu <run>".into(), b)],
        };
        let panels = vec![Panel {
            title: "q4_0 & ub512".into(),
            groups: vec![vec![bar(3.0, 2.0), bar(1.0, 0.0)], vec![bar(2.0, 2.0)]],
        }];
        let svg = render("t", "layer", "ms", &panels, 400.0);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        // Five non-empty segments plus the legend's two swatches and the background.
        assert_eq!(svg.matches("<rect").count(), 5 + 2 + 1);
        assert!(svg.contains("q4_0 &amp; ub512") && svg.contains("npu &lt;run&gt;"));
        assert_eq!(step(4.3), 1.0);
        assert_eq!(step(430.0), 100.0);
        assert_eq!(format_tick(1500.0), "1.5k");
        assert_eq!(format_tick(2000.0), "2k");
    }
}
