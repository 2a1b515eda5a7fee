//! The probe's charts as SVG, written by hand: a few hundred elements that do not need a plotting
//! crate. A chart is panels in a grid under a title, each with its title, frame, y axis and axis
//! labels, and below them a legend of the names drawn. [`lines`] draws lines on log-log axes (the
//! sweep), [`bars`] stacked bars on a linear axis (the model); a chart's caller only describes
//! its data.

pub mod bars;
pub mod lines;

use std::fmt::Write;

/// Colours of the names drawn, in order of first appearance.
const PALETTE: [&str; 16] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#000000", "#e6550d", "#843c39", "#7b4173",
];
/// Height of the chart's title and of a panel.
const TITLE_H: f64 = 40.0;
const PANEL_H: f64 = 300.0;
/// Room in a panel around its plot: tick labels and the y label on the left, the panel's title
/// on top, tick labels and the x label below.
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;
/// Legend rows and where their entries start.
const LEGEND_ROW: f64 = 16.0;
const LEGEND_X: f64 = 16.0;

/// How a name is drawn, and so its legend entry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mark {
    Line { dashed: bool },
    Fill,
}

impl Mark {
    fn swatch_width(self) -> f64 {
        match self {
            Mark::Line { .. } => 22.0,
            Mark::Fill => 12.0,
        }
    }
}

/// A chart being written.
pub struct Chart {
    out: String,
    cols: usize,
    panel_w: f64,
    /// The names drawn, in order of first appearance, each with its mark and its legend entry's
    /// place (left, baseline).
    names: Vec<(String, Mark, (f64, f64))>,
}

/// A panel's plot area: its left and top edges and its size.
pub struct Plot {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
}

impl Plot {
    /// The x of the fraction `f` of the width.
    pub fn x(&self, f: f64) -> f64 {
        self.left + f * self.width
    }

    /// The y of the fraction `f` of the height, from the bottom.
    pub fn y(&self, f: f64) -> f64 {
        self.top + self.height - f * self.height
    }
}

impl Chart {
    /// A chart of `panels` panels `panel_w` wide in `cols` columns under `title`, with a legend
    /// of `names` (each counted once, with its first mark).
    pub fn new(
        title: &str,
        panels: usize,
        cols: usize,
        panel_w: f64,
        names: impl IntoIterator<Item = (String, Mark)>,
    ) -> Chart {
        let cols = cols.max(1);
        let width = panel_w * cols as f64;
        let mut unique: Vec<(String, Mark)> = Vec::new();
        for (name, mark) in names {
            if !unique.iter().any(|(n, _)| *n == name) {
                unique.push((name, mark));
            }
        }
        // Entries left to right, wrapped at the chart's width.
        let (mut x, mut row) = (LEGEND_X, 0);
        let mut places = Vec::new();
        for (name, mark) in &unique {
            let w = mark.swatch_width() + 14.0 + 6.5 * name.len() as f64;
            if x + w > width && x > LEGEND_X {
                (x, row) = (LEGEND_X, row + 1);
            }
            places.push((x, row));
            x += w;
        }
        let legend_h = 6.0 + LEGEND_ROW * (row + 1) as f64;
        let height = TITLE_H + PANEL_H * panels.div_ceil(cols) as f64 + legend_h;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#,
            w = num(width),
            h = num(height)
        );
        let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let mut chart = Chart {
            out,
            cols,
            panel_w,
            names: unique
                .into_iter()
                .zip(places)
                .map(|((name, mark), (x, row))| {
                    let baseline = height - legend_h + 14.0 + LEGEND_ROW * row as f64;
                    (name, mark, (x, baseline))
                })
                .collect(),
        };
        chart.text(width / 2.0, 22.0, "middle", Some(14), title);
        chart
    }

    /// Draws panel `index`'s title, frame, y axis (grid lines and labels at `y`'s ticks) and
    /// axis labels; returns its plot area.
    pub fn panel(
        &mut self,
        index: usize,
        title: &str,
        x_label: &str,
        y_label: &str,
        y: &Scale,
    ) -> Plot {
        let left = (index % self.cols) as f64 * self.panel_w;
        let top = TITLE_H + (index / self.cols) as f64 * PANEL_H;
        let plot = Plot {
            left: left + LEFT,
            top: top + TOP,
            width: self.panel_w - LEFT - RIGHT,
            height: PANEL_H - TOP - BOTTOM,
        };
        let centre = plot.x(0.5);
        self.text(centre, top + 18.0, "middle", Some(12), title);
        let _ = writeln!(
            self.out,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
            num(plot.left),
            num(plot.top),
            num(plot.width),
            num(plot.height)
        );
        for &v in &y.ticks {
            let at = plot.y(y.at(v));
            let _ = writeln!(
                self.out,
                r##"<line x1="{}" y1="{a}" x2="{}" y2="{a}" stroke="#ddd"/>"##,
                num(plot.left),
                num(plot.x(1.0)),
                a = num(at)
            );
            self.text(plot.left - 4.0, at + 4.0, "end", None, &tick_label(v));
        }
        self.text(centre, top + PANEL_H - 8.0, "middle", None, x_label);
        let _ = writeln!(
            self.out,
            r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            num(left + 14.0),
            num(plot.y(0.5)),
            escape(y_label)
        );
        plot
    }

    /// A label under `plot` at `x`.
    pub fn x_tick(&mut self, plot: &Plot, x: f64, label: &str) {
        self.text(x, plot.top + plot.height + 14.0, "middle", None, label);
    }

    /// `name`'s line through `points`, a dot on each.
    pub fn line(&mut self, name: &str, points: &[(f64, f64)]) {
        let (color, mark) = self.style(name);
        let dash = match mark {
            Mark::Line { dashed: true } => r#" stroke-dasharray="5,3""#,
            _ => "",
        };
        let path: Vec<String> = points
            .iter()
            .map(|&(x, y)| format!("{},{}", num(x), num(y)))
            .collect();
        let _ = writeln!(
            self.out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>"#,
            path.join(" ")
        );
        for &(x, y) in points {
            let _ = writeln!(
                self.out,
                r#"<circle cx="{}" cy="{}" r="2.2" fill="{color}"/>"#,
                num(x),
                num(y)
            );
        }
    }

    /// `name`'s filled box from (`x`, `y`) down and right.
    pub fn fill(&mut self, name: &str, x: f64, y: f64, width: f64, height: f64) {
        let (color, _) = self.style(name);
        let _ = writeln!(
            self.out,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{color}"/>"#,
            num(x),
            num(y),
            num(width),
            num(height)
        );
    }

    /// The legend, and the document's end.
    pub fn finish(mut self) -> String {
        let names = std::mem::take(&mut self.names);
        for (i, (name, mark, (x, y))) in names.into_iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let _ = match mark {
                Mark::Line { dashed } => writeln!(
                    self.out,
                    r#"<line x1="{}" y1="{y4}" x2="{}" y2="{y4}" stroke="{color}" stroke-width="2"{}/>"#,
                    num(x),
                    num(x + 22.0),
                    if dashed {
                        r#" stroke-dasharray="5,3""#
                    } else {
                        ""
                    },
                    y4 = num(y - 4.0)
                ),
                Mark::Fill => writeln!(
                    self.out,
                    r#"<rect x="{}" y="{}" width="12" height="10" fill="{color}"/>"#,
                    num(x),
                    num(y - 9.0)
                ),
            };
            self.text(x + mark.swatch_width() + 4.0, y, "start", None, &name);
        }
        self.out.push_str("</svg>\n");
        self.out
    }

    /// `name`'s colour and mark.
    fn style(&self, name: &str) -> (&'static str, Mark) {
        let i = self
            .names
            .iter()
            .position(|n| n.0 == name)
            .expect("a name given to Chart::new");
        (PALETTE[i % PALETTE.len()], self.names[i].1)
    }

    fn text(&mut self, x: f64, y: f64, anchor: &str, size: Option<u32>, text: &str) {
        let anchor = match anchor {
            "start" => String::new(),
            a => format!(r#" text-anchor="{a}""#),
        };
        let size = size.map_or(String::new(), |s| format!(r#" font-size="{s}""#));
        let _ = writeln!(
            self.out,
            r#"<text x="{}" y="{}"{anchor}{size}>{}</text>"#,
            num(x),
            num(y),
            escape(text)
        );
    }
}

/// Where values fall along an axis, as a fraction of its length, and where its ticks go.
pub struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    /// Values with a grid line and a label.
    pub ticks: Vec<f64>,
}

impl Scale {
    /// From 0 to a round value at or above `max`, a tick every round step (about five).
    pub fn linear(max: f64) -> Scale {
        let step = step(max);
        let steps = (max / step).ceil().max(1.0);
        Scale {
            lo: 0.0,
            hi: steps * step,
            log: false,
            ticks: (0..=steps as usize).map(|i| i as f64 * step).collect(),
        }
    }

    /// Logarithmic over the whole decades around `lo`..`hi` (at least one), a tick on each.
    pub fn decades(lo: f64, hi: f64) -> Scale {
        let first = lo.log10().floor();
        let last = hi.log10().ceil().max(first + 1.0);
        Scale {
            lo: 10f64.powf(first),
            hi: 10f64.powf(last),
            log: true,
            ticks: (first as i32..=last as i32)
                .map(|d| 10f64.powi(d))
                .collect(),
        }
    }

    /// Logarithmic from `lo` to `hi` (at least a doubling), no ticks.
    pub fn log(lo: f64, hi: f64) -> Scale {
        Scale {
            lo,
            hi: hi.max(2.0 * lo),
            log: true,
            ticks: Vec::new(),
        }
    }

    /// The fraction of the axis at `v`.
    pub fn at(&self, v: f64) -> f64 {
        if self.log {
            (v / self.lo).ln() / (self.hi / self.lo).ln()
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }
}

/// A round step (1, 2 or 5 times a power of ten) giving about five steps up to `max`.
fn step(max: f64) -> f64 {
    let raw = (max / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag)
}

/// An axis value as a label: 0.5, 20, 1.5k, 10k, 1M.
fn tick_label(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.01 {
        return format!("{v:e}");
    }
    let (x, unit) = if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    format!("{}{unit}", num(x))
}

/// A coordinate or label number: at most two decimals, no trailing zeros.
fn num(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    match s {
        "-0" => "0".to_string(),
        s => s.to_string(),
    }
}

/// `s` with the characters XML reserves escaped.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_place_values_and_ticks() {
        assert_eq!(step(4.3), 1.0);
        assert_eq!(step(430.0), 100.0);
        assert_eq!(step(0.9), 0.2);
        let lin = Scale::linear(430.0);
        assert_eq!(lin.ticks, [0.0, 100.0, 200.0, 300.0, 400.0, 500.0]);
        assert_eq!(lin.at(250.0), 0.5);
        let dec = Scale::decades(30.0, 2000.0);
        assert_eq!(dec.ticks, [10.0, 100.0, 1000.0, 10000.0]);
        assert!((dec.at(100.0) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(Scale::decades(100.0, 100.0).ticks, [100.0, 1000.0]);
        let log = Scale::log(8.0, 8.0);
        assert_eq!((log.at(8.0), log.at(16.0)), (0.0, 1.0));
        assert!((Scale::log(8.0, 128.0).at(32.0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn labels_and_numbers() {
        assert_eq!(tick_label(1500.0), "1.5k");
        assert_eq!(tick_label(2000.0), "2k");
        assert_eq!(tick_label(1e5), "100k");
        assert_eq!(tick_label(1e6), "1M");
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(0.001), "1e-3");
        assert_eq!(num(306.0), "306");
        assert_eq!(num(99.855), "99.86");
        assert_eq!(num(-0.001), "0");
        assert_eq!(escape("a & <b>"), "a &amp; &lt;b&gt;");
    }

    #[test]
    fn the_legend_wraps_at_the_chart_width() {
        let names = (0..6).map(|i| (format!("name {i}"), Mark::Fill));
        let chart = Chart::new("t", 1, 1, 200.0, names);
        let rows: Vec<f64> = chart.names.iter().map(|n| n.2 .1).collect();
        // Each entry 12 + 14 + 6.5 * 6 = 65 wide from 16: two to a row of 200.
        assert_eq!(rows, [354.0, 354.0, 370.0, 370.0, 386.0, 386.0]);
        let svg = chart.finish();
        assert!(svg.contains(r#"height="394""#), "{svg}");
        assert_eq!(svg.matches("<rect").count(), 1 + 6);
    }
}
