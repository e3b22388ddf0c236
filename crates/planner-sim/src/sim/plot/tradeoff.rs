//! The trade-off at a glance: GPU-hours relative to the oracle (x, log scale) against the share
//! of intervals meeting the SLA (y), one point per policy, the scorecard's bar shaded. One
//! panel per run; a figure of one run labels every point (points that coincide share a
//! label), a figure of several runs (small multiples on shared axes) labels the policies of
//! [`TIMELINE_POLICIES`](super::TIMELINE_POLICIES) and has a legend of every policy.

use plotters::{coord::Shift, prelude::*};

use super::{
    Canvas, DrawResult, FONT, Legend, PlotError, Swatch, TIMELINE_POLICIES, colour, draw_error, draw_title,
    wrap,
};

/// One policy in one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The policy.
    pub policy: String,
    /// GPU-hours over the oracle's.
    pub cost: f64,
    /// Share of intervals meeting the SLA (0 to 1).
    pub met: f64,
}

/// `points` without the `-nocorr` variants drawn where their parent is (upstream's
/// corrections often change nothing): what a figure draws.
pub fn without_twins(points: Vec<Point>) -> Vec<Point> {
    let parent = |name: &str| {
        name.find("-nocorr")
            .map(|at| format!("{}{}", &name[..at], &name[at + 7..]))
    };
    points
        .iter()
        .filter(|p| {
            parent(&p.policy).is_none_or(|name| {
                !points
                    .iter()
                    .any(|q| q.policy == name && q.cost == p.cost && q.met == p.met)
            })
        })
        .cloned()
        .collect()
}

/// One run.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    /// The run (trace and rate scale).
    pub title: String,
    /// Its policies.
    pub points: Vec<Point>,
}

/// The figure.
pub struct Tradeoff {
    /// Title; wrapped to the figure's width.
    pub title: String,
    /// One panel per run.
    pub panels: Vec<Panel>,
    /// The scorecard's bar, shaded: at most this cost for at least this share.
    pub bar: Option<(f64, f64)>,
}

const COLUMNS: usize = 4;
const SINGLE: (u32, u32) = (1200, 860);
const CELL: (u32, u32) = (440, 390);
const LABEL_FONT: u32 = 15;

/// Pixel box: left, top, right, bottom.
type Rect = (i32, i32, i32, i32);

fn overlaps(a: Rect, b: Rect) -> bool {
    a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3
}

/// A label's lines for policies drawn at one place: upstream's variants folded as
/// `upstream-{constant, arima-u70}`, at most about 34 characters a line.
pub(crate) fn cluster_label(names: &[&str]) -> Vec<String> {
    let family = "upstream-";
    let folded: Vec<&str> = names.iter().copied().filter(|n| n.starts_with(family)).collect();
    let mut pieces: Vec<String> = Vec::new();
    for name in names {
        if name.starts_with(family) && folded.len() > 1 {
            if pieces.iter().all(|p| !p.starts_with(family)) {
                let rest: Vec<&str> = folded.iter().map(|n| &n[family.len()..]).collect();
                pieces.push(format!("{family}{{{}}}", rest.join(", ")));
            }
        } else {
            pieces.push((*name).to_string());
        }
    }
    let mut lines: Vec<String> = Vec::new();
    for piece in pieces {
        match lines.last_mut() {
            Some(line) if line.len() + piece.len() + 2 <= 34 => {
                line.push_str(", ");
                line.push_str(&piece);
            }
            _ => lines.push(piece),
        }
    }
    // A folded family longer than a line is broken after its commas.
    lines
        .into_iter()
        .flat_map(|line| {
            if line.len() <= 40 {
                return vec![line];
            }
            let mut out: Vec<String> = vec![String::new()];
            for part in line.split_inclusive(", ") {
                let last = out.last_mut().map_or(0, |l| l.len());
                if last + part.len() > 34 && last > 0 {
                    out.push(format!("  {part}"));
                } else if let Some(l) = out.last_mut() {
                    l.push_str(part);
                }
            }
            out.into_iter().map(|l| l.trim_end().to_string()).collect()
        })
        .collect()
}

/// Ticks of the cost axis within `range`.
fn cost_ticks(low: f64, high: f64) -> Vec<f64> {
    [
        0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 20.0,
    ]
    .into_iter()
    .filter(|v| *v >= low && *v <= high)
    .collect()
}

fn cost_label(v: f64) -> String {
    format!("{}x", super::tick(v))
}

impl Tradeoff {
    fn single(&self) -> bool {
        self.panels.len() == 1
    }

    /// The cost axis every panel shares.
    fn cost_range(&self) -> (f64, f64) {
        let costs = self
            .panels
            .iter()
            .flat_map(|p| p.points.iter().map(|q| q.cost))
            .filter(|c| c.is_finite() && *c > 0.0);
        let (low, high) = costs.fold((0.9_f64, 1.45_f64), |(l, h), c| (l.min(c), h.max(c)));
        ((low / 1.15).max(0.02), high * 1.15)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<()> {
        let (width, _) = self.size();
        let title_style = (FONT, 22).into_text_style(root);
        let mut lines = wrap(root, &self.title, &title_style, width - 40)?;
        if let Some((cost, met)) = self.bar {
            let note = format!(
                "shaded: the scorecard's bar, at least {:.0} % of intervals for at most {cost}x the oracle's GPU-hours; \
                 a -nocorr variant is drawn only where it differs from its parent",
                met * 100.0
            );
            lines.extend(wrap(root, &note, &title_style, width - 40)?);
        }
        let title_h = draw_title(root, &lines, 22, (20, 12))?;
        let mut top = 18 + title_h;
        if !self.single() {
            let mut names: Vec<&str> = Vec::new();
            for point in self.panels.iter().flat_map(|p| &p.points) {
                if !names.contains(&point.policy.as_str()) {
                    names.push(&point.policy);
                }
            }
            let entries = names
                .iter()
                .map(|n| (Swatch::Dot(colour(n)), (*n).to_string()))
                .collect();
            let legend = Legend::layout(root, entries, width - 40, 16)?;
            legend.draw(root, (20, top))?;
            top += legend.height as i32 + 6;
        }
        let (_, body) = root.split_vertically(top);
        let rows = self.panels.len().div_ceil(COLUMNS).max(1);
        let columns = if self.single() { 1 } else { COLUMNS };
        let cells = body.split_evenly((rows, columns));
        let range = self.cost_range();
        for (panel, area) in self.panels.iter().zip(&cells) {
            self.draw_panel(area, panel, range)?;
        }
        Ok(())
    }

    fn draw_panel<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        panel: &Panel,
        (low, high): (f64, f64),
    ) -> DrawResult<()> {
        let single = self.single();
        let font = if single { 17 } else { 14 };
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, (FONT, if single { 20 } else { 17 }))
            .margin(if single { 14 } else { 8 })
            .x_label_area_size(if single { 48 } else { 40 })
            .y_label_area_size(if single { 70 } else { 56 })
            .build_cartesian_2d(
                (low..high).log_scale().with_key_points(cost_ticks(low, high)),
                -4.0..114.0,
            )
            .map_err(draw_error)?;
        let x_format = |v: &f64| cost_label(*v);
        let y_format = |v: &f64| format!("{v:.0}%");
        chart
            .configure_mesh()
            .x_desc("GPU-hours / the oracle's (log scale)")
            .y_desc("intervals meeting the SLA")
            .x_label_formatter(&x_format)
            .y_label_formatter(&y_format)
            .y_labels(6)
            .max_light_lines(1)
            .light_line_style(RGBColor(246, 246, 246))
            .label_style((FONT, font))
            .axis_desc_style((FONT, font))
            .draw()
            .map_err(draw_error)?;
        if let Some((cost, met)) = self.bar {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(low, met * 100.0), (cost.min(high), 101.0)],
                    RGBColor(0, 158, 115).mix(0.12).filled(),
                )))
                .map_err(draw_error)?;
        }
        self.draw_points(&mut chart, panel, single)
    }

    /// The markers (those a small multiple labels drawn last, larger), then the labels where
    /// they cover neither a marker nor another label.
    fn draw_points<DB, X, Y>(
        &self,
        chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
        panel: &Panel,
        single: bool,
    ) -> DrawResult<()>
    where
        DB: DrawingBackend,
        X: Ranged<ValueType = f64>,
        Y: Ranged<ValueType = f64>,
    {
        let key = |p: &Point| TIMELINE_POLICIES.contains(&p.policy.as_str());
        let labelled = |p: &Point| single || key(p);
        let radius = |p: &Point| if key(p) { 7 } else { 5 };
        let mut points: Vec<&Point> = panel
            .points
            .iter()
            .filter(|p| p.cost.is_finite() && p.cost > 0.0 && p.met.is_finite())
            .collect();
        points.sort_by_key(|p| key(p));
        let at = |p: &Point| (p.cost, p.met * 100.0);
        for p in &points {
            let c = colour(&p.policy);
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at(at(p))
                        + Circle::new((0, 0), radius(p), c.filled())
                        + Circle::new((0, 0), radius(p), WHITE.stroke_width(1)),
                ))
                .map_err(draw_error)?;
        }
        // Places: markers within 4 px of each other share a label.
        let pixel: Vec<(i32, i32)> = points.iter().map(|p| chart.backend_coord(&at(p))).collect();
        let mut clusters: Vec<Vec<usize>> = Vec::new();
        for (i, p) in points.iter().enumerate() {
            if !labelled(p) {
                continue;
            }
            let near = clusters.iter_mut().find(|c| {
                let q = pixel[c[0]];
                (q.0 - pixel[i].0).abs() <= 4 && (q.1 - pixel[i].1).abs() <= 4
            });
            match near {
                Some(cluster) => cluster.push(i),
                None => clusters.push(vec![i]),
            }
        }
        // Most crowded first, in the panel's order of policies within a cluster.
        let order = |i: usize| panel.points.iter().position(|q| q.policy == points[i].policy);
        for cluster in &mut clusters {
            cluster.sort_by_key(|&i| order(i));
        }
        clusters.sort_by_key(|c| std::cmp::Reverse(c.len()));
        let markers: Vec<(Rect, bool)> = pixel
            .iter()
            .zip(&points)
            .map(|(&(x, y), p)| {
                let r = radius(p);
                ((x - r, y - r, x + r, y + r), labelled(p))
            })
            .collect();
        let (x_range, y_range) = chart.plotting_area().get_pixel_range();
        let bounds: Rect = (x_range.start, y_range.start, x_range.end, y_range.end);
        let style = (FONT, LABEL_FONT).into_text_style(chart.plotting_area());
        let line_h = LABEL_FONT as i32 + 3;
        let mut placed: Vec<Rect> = Vec::new();
        for cluster in clusters {
            let names: Vec<&str> = cluster.iter().map(|&i| points[i].policy.as_str()).collect();
            let lines = cluster_label(&names);
            let mut w = 0;
            for line in &lines {
                let (lw, _) = chart
                    .plotting_area()
                    .estimate_text_size(line, &style)
                    .map_err(draw_error)?;
                w = w.max(lw as i32);
            }
            let h = line_h * lines.len() as i32;
            let anchor = pixel[cluster[0]];
            let r = cluster.iter().map(|&i| radius(points[i])).max().unwrap_or(5);
            let own: Vec<Rect> = cluster.iter().map(|&i| markers[i].0).collect();
            let (dx, dy) = place((w, h), anchor, r, bounds, &placed, &markers, &own);
            placed.push((anchor.0 + dx, anchor.1 + dy, anchor.0 + dx + w, anchor.1 + dy + h));
            let origin = at(points[cluster[0]]);
            let far = dx > r + 8 || dx + w < -r - 8 || dy > r + 8 || dy + h < -r - 8;
            if far {
                // To the nearest point of the label's box.
                let to = (0.clamp(dx, dx + w), 0.clamp(dy, dy + h));
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at(origin)
                            + PathElement::new(vec![(0, 0), to], RGBColor(120, 120, 120).stroke_width(1)),
                    ))
                    .map_err(draw_error)?;
            }
            for (k, line) in lines.iter().enumerate() {
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at(origin)
                            + Text::new(line.clone(), (dx, dy + k as i32 * line_h), style.clone()),
                    ))
                    .map_err(draw_error)?;
            }
        }
        Ok(())
    }

    /// Writes `<stem>.png` and `<stem>.svg` in `dir`; returns their paths.
    pub fn write(
        &self,
        dir: &std::path::Path,
        stem: &str,
    ) -> Result<(std::path::PathBuf, std::path::PathBuf), PlotError> {
        super::write_figure(self, dir, stem)
    }

    /// The figure as an SVG document.
    pub fn render_svg(&self) -> Result<String, PlotError> {
        super::render_svg(self)
    }
}

/// Where a `(w, h)` label goes relative to the marker at `anchor` (of radius `r`): of the
/// places around it inside `bounds`, the one that covers least, a label of `placed` costing
/// most, then a labelled marker, then another marker (`markers`: each with whether it is
/// labelled; the label's `own` markers cost nothing), then distance.
fn place(
    (w, h): (i32, i32),
    anchor: (i32, i32),
    r: i32,
    bounds: Rect,
    placed: &[Rect],
    markers: &[(Rect, bool)],
    own: &[Rect],
) -> (i32, i32) {
    let mut candidates: Vec<(i32, (i32, i32))> = Vec::new();
    for (rank, step) in [0, 14, 30, 50, 80, 120].into_iter().enumerate() {
        let gap = r + 4 + step;
        let rank = rank as i32;
        candidates.extend(
            [
                (gap, -h / 2),
                (-gap - w, -h / 2),
                (-w / 2, -gap - h),
                (-w / 2, gap),
                (gap, -gap - h + h / 2),
                (gap, gap - h / 2),
                (-gap - w, -gap - h + h / 2),
                (-gap - w, gap - h / 2),
                (0, -gap - h),
                (-w, -gap - h),
                (0, gap),
                (-w, gap),
            ]
            .map(|c| (rank, c)),
        );
    }
    let mut best = (i32::MAX, candidates[0].1);
    for (rank, (dx, dy)) in candidates {
        let rect = (anchor.0 + dx, anchor.1 + dy, anchor.0 + dx + w, anchor.1 + dy + h);
        if rect.0 < bounds.0 || rect.1 < bounds.1 || rect.2 > bounds.2 || rect.3 > bounds.3 {
            continue;
        }
        // Kept a few pixels apart from what it should not cover.
        let padded = (rect.0 - 4, rect.1 - 2, rect.2 + 4, rect.3 + 2);
        let labels = placed.iter().filter(|b| overlaps(padded, **b)).count() as i32;
        let (mut labelled, mut others) = (0, 0);
        for (m, is_labelled) in markers {
            if !own.contains(m) && overlaps(padded, *m) {
                if *is_labelled {
                    labelled += 1;
                } else {
                    others += 1;
                }
            }
        }
        let cost = 1000 * labels + 60 * labelled + 4 * others + 25 * rank;
        if cost == 0 {
            return (dx, dy);
        }
        if cost < best.0 {
            best = (cost, (dx, dy));
        }
    }
    best.1
}

impl Canvas for Tradeoff {
    fn size(&self) -> (u32, u32) {
        if self.single() {
            SINGLE
        } else {
            let rows = self.panels.len().div_ceil(COLUMNS).max(1) as u32;
            (CELL.0 * COLUMNS as u32 + 20, 170 + CELL.1 * rows)
        }
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<()> {
        self.draw(root)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nocorr_twins_are_drawn_only_where_they_differ() {
        let points = vec![
            point("upstream-arima", 0.64, 0.02),
            point("upstream-arima-nocorr", 0.64, 0.02),
            point("upstream-kalman", 0.7, 0.02),
            point("upstream-kalman-nocorr", 0.72, 0.02),
        ];
        let drawn: Vec<String> = without_twins(points).into_iter().map(|p| p.policy).collect();
        assert_eq!(
            drawn,
            ["upstream-arima", "upstream-kalman", "upstream-kalman-nocorr"]
        );
    }

    #[test]
    fn coinciding_points_share_a_folded_label() {
        assert_eq!(cluster_label(&["hpa"]), ["hpa"]);
        assert_eq!(
            cluster_label(&["perfect-prediction", "upstream-constant", "upstream-arima-u70"]),
            ["perfect-prediction", "upstream-{constant, arima-u70}"]
        );
        assert_eq!(cluster_label(&["oracle", "fixed-peak"]), ["oracle, fixed-peak"]);
        let many = cluster_label(&[
            "upstream-constant",
            "upstream-arima",
            "upstream-kalman",
            "upstream-prophet",
            "upstream-arima-u70",
        ]);
        assert!(many.len() >= 2 && many.iter().all(|l| l.len() <= 40), "{many:?}");
        assert!(many[0].starts_with("upstream-{constant"), "{many:?}");
    }

    #[test]
    fn labels_keep_clear_of_markers_and_each_other() {
        let bounds = (0, 0, 400, 300);
        // Free around: the first place, right of the marker.
        assert_eq!(place((50, 10), (100, 100), 5, bounds, &[], &[], &[]), (9, -5));
        // Right is taken by a label: left of the marker.
        let taken = [(105, 90, 200, 110)];
        assert_eq!(
            place((50, 10), (100, 100), 5, bounds, &taken, &[], &[]),
            (-59, -5)
        );
        // Right covers a labelled marker, left one without a label: above, clear of both.
        let markers = [((115, 95, 125, 105), true), ((60, 95, 70, 105), false)];
        assert_eq!(
            place((50, 10), (100, 100), 5, bounds, &[], &markers, &[]),
            (-25, -19)
        );
        // Near places all covering something: an unlabelled marker before a labelled one.
        let crowd = [
            ((115, 95, 125, 105), true),
            ((60, 95, 70, 105), false),
            ((95, 75, 105, 85), true),
            ((95, 108, 105, 118), true),
        ];
        let (dx, _) = place((50, 10), (100, 100), 5, (0, 90, 400, 110), &[], &crowd, &[]);
        assert_eq!(dx, -59);
        // Its own marker costs nothing.
        let own = [(95, 95, 105, 105)];
        let markers = [(own[0], true)];
        assert_eq!(
            place((50, 10), (100, 100), 5, bounds, &[], &markers, &own),
            (9, -5)
        );
        // At the right edge the label goes left.
        assert_eq!(place((50, 10), (390, 100), 5, bounds, &[], &[], &[]), (-59, -5));
    }

    fn point(policy: &str, cost: f64, met: f64) -> Point {
        Point {
            policy: policy.into(),
            cost,
            met,
        }
    }

    #[test]
    fn one_run_labels_every_policy_and_several_label_the_four_with_a_legend() {
        let points = vec![
            point("oracle", 1.0, 1.0),
            point("sla-arima", 1.27, 0.95),
            point("hpa", 1.46, 0.95),
            point("fixed-peak", 1.28, 1.0),
            point("upstream-arima", 0.64, 0.02),
            point("upstream-kalman", 0.64, 0.02),
        ];
        let one = Tradeoff {
            title: "azure2023_conv at k=4".into(),
            panels: vec![Panel {
                title: "azure2023_conv k=4".into(),
                points: points.clone(),
            }],
            bar: Some((1.3, 0.95)),
        };
        let svg = one.render_svg().unwrap();
        assert!(svg.contains("upstream-{arima, kalman}"), "{svg}");
        assert!(svg.contains("shaded: the scorecard"), "{svg}");
        let several = Tradeoff {
            title: "every run".into(),
            panels: vec![
                Panel {
                    title: "a".into(),
                    points: points.clone(),
                },
                Panel {
                    title: "b".into(),
                    points,
                },
            ],
            bar: None,
        };
        let svg = several.render_svg().unwrap();
        let texts = |name: &str| svg.lines().filter(|l| l.trim() == name).count();
        // In the legend once, not as a label; the four labelled in each panel.
        assert_eq!(texts("upstream-arima"), 1, "{svg}");
        assert_eq!(texts("hpa"), 3, "{svg}");
    }
}
