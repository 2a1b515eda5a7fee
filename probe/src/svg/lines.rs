//! Lines on log-log axes: per panel, a line through each series' points, a label under each x
//! that has one.

use super::{Chart, Mark, Scale};

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

const PANEL_W: f64 = 420.0;

/// `panels` in a grid of `cols` columns under `title`; `x_label` and `y_label` name the axes.
pub fn render(title: &str, x_label: &str, y_label: &str, panels: &[Panel], cols: usize) -> String {
    let names = panels.iter().flat_map(|p| &p.series).map(|s| {
        let mark = Mark::Line { dashed: s.dashed };
        (s.name.clone(), mark)
    });
    let mut chart = Chart::new(title, panels.len(), cols, PANEL_W, names);
    for (i, p) in panels.iter().enumerate() {
        let drawn = |s: &Series| {
            let points = s.points.iter().copied();
            points
                .filter(|&(x, y)| x > 0.0 && y > 0.0)
                .collect::<Vec<_>>()
        };
        let all: Vec<(f64, f64)> = p.series.iter().flat_map(drawn).collect();
        if all.is_empty() {
            continue;
        }
        let (x, y) = (
            Scale::log(min(all.iter().map(|p| p.0)), max(all.iter().map(|p| p.0))),
            Scale::decades(min(all.iter().map(|p| p.1)), max(all.iter().map(|p| p.1))),
        );
        let plot = chart.panel(i, &p.title, x_label, y_label, &y);
        let mut xs: Vec<f64> = all.iter().map(|p| p.0).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        for v in xs {
            chart.x_tick(&plot, plot.x(x.at(v)), &v.to_string());
        }
        for s in &p.series {
            let points: Vec<(f64, f64)> = drawn(s)
                .into_iter()
                .map(|(a, b)| (plot.x(x.at(a)), plot.y(y.at(b))))
                .collect();
            chart.line(&s.name, &points);
        }
    }
    chart.finish()
}

fn min(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(f64::MAX, f64::min)
}

fn max(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(f64::MIN, f64::max)
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
        // The dashed line and its legend entry.
        assert_eq!(svg.matches("stroke-dasharray").count(), 2);
        // y from 10 to 1000: three decades' grid lines, labelled; x labelled at 8, 16 and 128.
        for label in [">10<", ">100<", ">1k<", ">8<", ">16<", ">128<"] {
            assert!(svg.contains(label), "{label}");
        }
        assert_eq!(svg.matches("stroke=\"#ddd\"").count(), 3);
    }
}
