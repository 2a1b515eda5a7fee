//! Stacked bars on a linear axis: per panel, groups of bars (one group per x position), each bar
//! a stack of named segments.

use super::{Chart, Mark, Scale};

pub struct Bar {
    /// Segments bottom up: (name, value).
    pub segments: Vec<(String, f64)>,
}

pub struct Panel {
    pub title: String,
    /// One group of bars per x position.
    pub groups: Vec<Vec<Bar>>,
}

/// `panels` one above the other, `width` wide, under `title`; `x_label` names a group (labelled
/// with its index), `y_label` the axis.
pub fn render(title: &str, x_label: &str, y_label: &str, panels: &[Panel], width: f64) -> String {
    let bars = || panels.iter().flat_map(|p| p.groups.iter().flatten());
    let names = bars()
        .flat_map(|b| &b.segments)
        .map(|s| (s.0.clone(), Mark::Fill));
    let mut chart = Chart::new(title, panels.len(), 1, width, names);
    for (i, p) in panels.iter().enumerate() {
        let bars = p.groups.iter().flatten();
        let max = bars
            .map(|b| b.segments.iter().map(|s| s.1).sum::<f64>())
            .fold(0.0, f64::max);
        let y = Scale::linear(max);
        let plot = chart.panel(i, &p.title, x_label, y_label, &y);
        let groups = p.groups.len().max(1);
        let group_w = plot.width / groups as f64;
        for (gi, group) in p.groups.iter().enumerate() {
            let bar_w = group_w * 0.8 / group.len().max(1) as f64;
            let left = plot.left + gi as f64 * group_w + group_w * 0.1;
            for (bi, bar) in group.iter().enumerate() {
                let x = left + bi as f64 * bar_w;
                let mut base = 0.0;
                for (name, value) in bar.segments.iter().filter(|s| s.1 > 0.0) {
                    let (bottom, top) = (plot.y(y.at(base)), plot.y(y.at(base + value)));
                    chart.fill(name, x, top, bar_w * 0.92, bottom - top);
                    base += value;
                }
            }
            if groups <= 16 || gi % 4 == 0 {
                chart.x_tick(&plot, left + group_w * 0.4, &gi.to_string());
            }
        }
    }
    chart.finish()
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
        // Five non-empty segments, the legend's two swatches, the frame and the background.
        assert_eq!(svg.matches("<rect").count(), 5 + 2 + 1 + 1);
        assert!(svg.contains("q4_0 &amp; ub512") && svg.contains("npu &lt;run&gt;"));
        // 0 to 5 in steps of 1: six grid lines; the two groups labelled 0 and 1.
        assert_eq!(svg.matches("stroke=\"#ddd\"").count(), 6);
        for label in [">0<", ">5<", ">1<"] {
            assert!(svg.contains(label), "{label}");
        }
    }
}
