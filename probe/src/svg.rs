//! A small hand-written SVG line chart: one panel per expert shape, time against M on log-log
//! axes, one line per path. Hand-written because it needs a few dozen elements, and a plotting
//! crate would add far more code than this file.

use std::fmt::Write;

/// One line of a panel.
pub struct Series {
    pub name: String,
    /// `(x, y)` with both > 0 (log axes); other points are skipped.
    pub points: Vec<(f64, f64)>,
    /// Dashed lines mark modelled (not measured) values.
    pub dashed: bool,
}

pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 300.0;
const MARGIN_L: f64 = 62.0;
const MARGIN_B: f64 = 42.0;
const MARGIN_T: f64 = 28.0;
const MARGIN_R: f64 = 12.0;

/// An SVG document `w` × `h` on a white background, `title` centred at the top (the caller
/// closes it with `</svg>`).
pub fn start(w: f64, h: f64, title: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        w / 2.0,
        escape(title)
    );
    s
}

/// `s` with the characters XML reserves escaped.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Decades (powers of ten) covering `[lo, hi]`.
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    (
        lo.log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    )
}

/// Renders `panels` in a grid of `cols` columns under `title`; `x_label` and `y_label` name the axes.
pub fn render(title: &str, x_label: &str, y_label: &str, panels: &[Panel], cols: usize) -> String {
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols);
    let legend_h = 22.0;
    let (w, h) = (
        PANEL_W * cols as f64,
        40.0 + PANEL_H * rows as f64 + legend_h,
    );
    let mut s = start(w, h, title);

    let mut names: Vec<(&str, bool)> = Vec::new();
    for p in panels {
        for se in &p.series {
            if !names.iter().any(|(n, _)| *n == se.name) {
                names.push((&se.name, se.dashed));
            }
        }
    }
    let color =
        |name: &str| COLORS[names.iter().position(|(n, _)| *n == name).unwrap_or(0) % COLORS.len()];

    for (i, p) in panels.iter().enumerate() {
        let (ox, oy) = (
            (i % cols) as f64 * PANEL_W,
            40.0 + (i / cols) as f64 * PANEL_H,
        );
        let pts: Vec<(f64, f64)> = p
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(x, y)| x > 0.0 && y > 0.0)
            .collect();
        if pts.is_empty() {
            continue;
        }
        let (xlo, xhi) = pts
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (ylo, yhi) = pts
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let (xl, xh) = (xlo.log2(), xhi.log2().max(xlo.log2() + 1.0));
        let (yd0, yd1) = decades(ylo, yhi);
        let (pw, ph) = (PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B);
        let px = |x: f64| ox + MARGIN_L + (x.log2() - xl) / (xh - xl) * pw;
        let py = |y: f64| oy + MARGIN_T + ph - (y.log10() - yd0) / (yd1 - yd0) * ph;

        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="12">{}</text>"#,
            ox + MARGIN_L + pw / 2.0,
            oy + 16.0,
            escape(&p.title)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##,
            ox + MARGIN_L,
            oy + MARGIN_T
        );
        let mut d = yd0;
        while d <= yd1 {
            let y = py(10f64.powf(d));
            let _ = writeln!(
                s,
                r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/>"##,
                ox + MARGIN_L,
                ox + MARGIN_L + pw
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                ox + MARGIN_L - 4.0,
                y + 4.0,
                fmt_pow10(d)
            );
            d += 1.0;
        }
        let mut xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        for x in xs {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{x}</text>"#,
                px(x),
                oy + MARGIN_T + ph + 14.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            ox + MARGIN_L + pw / 2.0,
            oy + PANEL_H - 8.0,
            escape(x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            ox + 14.0,
            oy + MARGIN_T + ph / 2.0,
            escape(y_label)
        );
        for se in &p.series {
            let path: Vec<String> = se
                .points
                .iter()
                .filter(|&&(x, y)| x > 0.0 && y > 0.0)
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let dash = if se.dashed {
                r#" stroke-dasharray="5,3""#
            } else {
                ""
            };
            let c = color(&se.name);
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="1.6"{dash}/>"#,
                path.join(" ")
            );
            for pt in &path {
                let (x, y) = pt.split_once(',').expect("formatted as x,y");
                let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="2.2" fill="{c}"/>"#);
            }
        }
    }
    let ly = h - 8.0;
    let mut lx = 16.0;
    for (name, dashed) in &names {
        let dash = if *dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"{dash}/>"#,
            ly - 4.0,
            lx + 22.0,
            ly - 4.0,
            color(name)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{ly}">{}</text>"#,
            lx + 26.0,
            escape(name)
        );
        lx += 36.0 + 6.5 * name.len() as f64;
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_pow10(d: f64) -> String {
    match d as i32 {
        0 => "1".into(),
        1 => "10".into(),
        2 => "100".into(),
        3 => "1k".into(),
        4 => "10k".into(),
        5 => "100k".into(),
        6 => "1M".into(),
        e => format!("1e{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_panels_lines_and_legend() {
        let panels = vec![Panel {
            title: "gate K=2048 N=768".into(),
            series: vec![
                Series {
                    name: "npu".into(),
                    points: vec![(8.0, 120.0), (16.0, 150.0), (128.0, 900.0)],
                    dashed: false,
                },
                Series {
                    name: "model <rk3588>".into(),
                    points: vec![(8.0, 60.0), (128.0, 0.0)],
                    dashed: true,
                },
            ],
        }];
        let svg = render("t & u", "M", "µs", &panels, 2);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4); // the y=0 point is skipped on a log axis
        assert!(svg.contains("t &amp; u") && svg.contains("model &lt;rk3588&gt;"));
        assert!(svg.contains("stroke-dasharray"));
    }
}
