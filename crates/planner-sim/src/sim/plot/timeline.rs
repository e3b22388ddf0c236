//! One run over time: arriving load (requests/s on the left axis, prompt tokens/s on the
//! right), GPUs asked for, and the cohort TTFT (log scale; values above the axis drawn at its
//! top with a triangle) and ITL against the SLA, one line per policy of
//! [`TIMELINE_POLICIES`](super::TIMELINE_POLICIES), under one legend above the panels.

use plotters::{
    coord::{Shift, ranged1d::ValueFormatter, types::RangedCoordf64},
    prelude::*,
};

use planner_core::sla::SlaTargets;

use super::{
    Canvas, DrawResult, FONT, Legend, PlotError, Swatch, TIMELINE_POLICIES, colour, draw_error, draw_title,
    tick, wrap,
};
use crate::sim::run::{IntervalRecord, RunResult};

const WIDTH: u32 = 1200;
const HEIGHT: u32 = 1560;
/// Colours of the load panel's two series (not policies).
const REQUESTS: RGBColor = RGBColor(60, 60, 60);
const TOKENS: RGBColor = RGBColor(204, 121, 167);
const SLA_LINE: RGBColor = RGBColor(90, 90, 90);

/// What the figure shows.
pub struct Figure<'a> {
    /// Title (trace, rate scale, profile); wrapped to the figure's width.
    pub title: String,
    /// The runs (the oracle among them); the figure draws those of
    /// [`TIMELINE_POLICIES`](super::TIMELINE_POLICIES) (every run when none but the oracle is
    /// among them).
    pub results: &'a [RunResult],
    /// Targets drawn as dashed lines.
    pub sla: SlaTargets,
    /// Interval length (s), for the request rate.
    pub interval_s: f64,
}

/// Segments of consecutive finite points (a NaN breaks the line).
fn segments(points: impl Iterator<Item = (f64, f64)>) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (x, y) in points {
        if y.is_finite() {
            if let Some(last) = out.last_mut() {
                last.push((x, y));
            }
        } else if out.last().is_some_and(|s| !s.is_empty()) {
            out.push(Vec::new());
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// A metric panel: what it reads and how its axis is drawn.
struct Metric {
    caption: String,
    value: fn(&IntervalRecord) -> f64,
    target: Option<f64>,
    log: bool,
}

/// Key points of a log axis from `low` to `high`: labelled decades (with 2 and 5 between when
/// the axis spans three decades or fewer), and unlabelled grid lines at the other multiples.
fn log_key_points(low: f64, high: f64) -> (Vec<f64>, Vec<f64>) {
    let (first, last) = (low.log10().floor() as i32, high.log10().ceil() as i32);
    let few = last - first <= 3;
    let (mut bold, mut light) = (Vec::new(), Vec::new());
    for exponent in first..=last {
        let decade = 10f64.powi(exponent);
        for m in 1..10 {
            let v = decade * f64::from(m);
            if v < low || v > high {
                continue;
            }
            if m == 1 || (few && (m == 2 || m == 5)) {
                bold.push(v);
            } else {
                light.push(v);
            }
        }
    }
    (bold, light)
}

impl Figure<'_> {
    /// The runs drawn, in the order of [`TIMELINE_POLICIES`](super::TIMELINE_POLICIES).
    pub fn drawn(&self) -> Vec<&RunResult> {
        let shown: Vec<&RunResult> = TIMELINE_POLICIES
            .iter()
            .filter_map(|name| self.results.iter().find(|r| r.policy == *name))
            .collect();
        if shown.iter().any(|r| r.policy != "oracle") {
            shown
        } else {
            self.results.iter().collect()
        }
    }

    fn minutes(&self) -> f64 {
        self.results
            .iter()
            .filter_map(|r| r.intervals.last())
            .map(|i| (i.start_s + self.interval_s) / 60.0)
            .fold(1.0, f64::max)
    }

    fn metrics(&self) -> [Metric; 3] {
        [
            Metric {
                caption: "GPUs asked for".into(),
                value: |i| i.gpus,
                target: None,
                log: false,
            },
            Metric {
                caption: "TTFT of the interval's arrivals (ms, log scale)".into(),
                value: |i| i.ttft_ms,
                target: Some(self.sla.ttft_ms),
                log: true,
            },
            Metric {
                caption: "ITL of the interval's arrivals (ms)".into(),
                value: |i| i.itl_ms,
                target: Some(self.sla.itl_ms),
                log: false,
            },
        ]
    }

    /// Where the TTFT axis stops: 100x the target at most, so that a saturated run does not
    /// flatten the others; values above it are drawn at it, with a triangle.
    fn ttft_cap(&self, runs: &[&RunResult]) -> f64 {
        let t = self.sla.ttft_ms;
        let data_max = runs
            .iter()
            .flat_map(|r| r.intervals.iter().map(|i| i.ttft_ms))
            .filter(|v| v.is_finite())
            .fold(t, f64::max);
        (t * 100.0).min(data_max.max(t * 2.0))
    }

    fn clipped(&self, runs: &[&RunResult], cap: f64) -> bool {
        runs.iter()
            .flat_map(|r| r.intervals.iter())
            .any(|i| i.ttft_ms > cap * (1.0 + 1e-9))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<()> {
        let runs = self.drawn();
        let cap = self.ttft_cap(&runs);
        let clipped = self.clipped(&runs, cap);
        let title_style = (FONT, 24).into_text_style(root);
        let lines = wrap(root, &self.title, &title_style, WIDTH - 40)?;
        let mut entries: Vec<(Swatch, String)> = runs
            .iter()
            .map(|r| {
                (
                    Swatch::Line(colour(&r.policy), width(&r.policy)),
                    r.policy.clone(),
                )
            })
            .collect();
        entries.push((Swatch::Dashed(SLA_LINE), "SLA target".into()));
        if clipped {
            entries.push((
                Swatch::Triangle(RGBColor(0, 0, 0)),
                format!("TTFT above {} ms (drawn at the top)", tick(cap)),
            ));
        }
        let legend = Legend::layout(root, entries, WIDTH - 40, 18)?;
        let title_h = draw_title(root, &lines, 24, (20, 12))?;
        legend.draw(root, (20, 16 + title_h))?;
        let (_, body) = root.split_vertically(24 + title_h + legend.height as i32);
        let panels = body.split_evenly((4, 1));
        let x_max = self.minutes();
        self.draw_load(&panels[0], x_max)?;
        for (panel, metric) in panels[1..].iter().zip(self.metrics()) {
            self.draw_metric(panel, x_max, &runs, &metric, cap)?;
        }
        Ok(())
    }

    fn draw_load<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>, x_max: f64) -> DrawResult<()> {
        let Some(run) = self.results.first() else {
            return Ok(());
        };
        let rate: Vec<(f64, f64)> = run
            .intervals
            .iter()
            .map(|i| (i.start_s / 60.0, i.arrivals as f64 / self.interval_s))
            .collect();
        let tokens: Vec<(f64, f64)> = run
            .intervals
            .iter()
            .map(|i| {
                let isl = if i.arrivals > 0 { i.mean_isl } else { 0.0 };
                (
                    i.start_s / 60.0,
                    i.arrivals as f64 * isl / self.interval_s / 1000.0,
                )
            })
            .collect();
        let top = |points: &[(f64, f64)]| points.iter().map(|p| p.1).fold(0.1, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption("Arriving load", (FONT, 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .right_y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max, 0.0..top(&rate))
            .map_err(draw_error)?
            .set_secondary_coord(0.0..x_max, 0.0..top(&tokens));
        let format = |v: &f64| tick(*v);
        chart
            .configure_mesh()
            .x_desc("minutes")
            .y_desc("requests/s")
            .x_label_formatter(&format)
            .y_label_formatter(&format)
            .max_light_lines(1)
            .light_line_style(RGBColor(242, 242, 242))
            .label_style((FONT, 16))
            .axis_desc_style((FONT, 17).into_font().color(&REQUESTS))
            .draw()
            .map_err(draw_error)?;
        chart
            .configure_secondary_axes()
            .y_desc("prompt tokens/s (thousands)")
            .y_label_formatter(&format)
            .label_style((FONT, 16))
            .axis_desc_style((FONT, 17).into_font().color(&TOKENS))
            .draw()
            .map_err(draw_error)?;
        let step = |points: &[(f64, f64)]| -> Vec<(f64, f64)> {
            points
                .iter()
                .flat_map(|&(x, y)| [(x, y), (x + self.interval_s / 60.0, y)])
                .collect()
        };
        chart
            .draw_series(LineSeries::new(step(&rate), REQUESTS.stroke_width(2)))
            .map_err(draw_error)?;
        chart
            .draw_secondary_series(LineSeries::new(step(&tokens), TOKENS.stroke_width(2)))
            .map_err(draw_error)?;
        Ok(())
    }

    fn draw_metric<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        x_max: f64,
        runs: &[&RunResult],
        metric: &Metric,
        ttft_cap: f64,
    ) -> DrawResult<()> {
        let values = || {
            runs.iter()
                .flat_map(|r| r.intervals.iter().map(metric.value))
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        let cap = if metric.log {
            ttft_cap
        } else {
            values().fold(metric.target.unwrap_or(0.0), f64::max).max(1.0)
        };
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(&metric.caption, (FONT, 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .right_y_label_area_size(80);
        if metric.log {
            let low = values().fold(f64::INFINITY, f64::min);
            let low = if low.is_finite() {
                (low * 0.8).max(1e-3)
            } else {
                1.0
            };
            let high = cap * 1.3;
            let (bold, light) = log_key_points(low, high);
            let mut chart = builder
                .build_cartesian_2d(
                    0.0..x_max,
                    (low..high)
                        .log_scale()
                        .with_key_points(bold)
                        .with_light_points(light),
                )
                .map_err(draw_error)?;
            self.draw_lines(&mut chart, x_max, runs, metric, cap)
        } else {
            let mut chart = builder
                .build_cartesian_2d(0.0..x_max, 0.0..cap * 1.1)
                .map_err(draw_error)?;
            self.draw_lines(&mut chart, x_max, runs, metric, cap)
        }
    }

    /// The mesh, the target and one line per run on `chart`; values above `cap` drawn at it
    /// with a triangle.
    fn draw_lines<DB, Y>(
        &self,
        chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, Y>>,
        x_max: f64,
        runs: &[&RunResult],
        metric: &Metric,
        cap: f64,
    ) -> DrawResult<()>
    where
        DB: DrawingBackend,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        let format = |v: &f64| tick(*v);
        chart
            .configure_mesh()
            .x_desc("minutes")
            .x_label_formatter(&format)
            .y_label_formatter(&format)
            .max_light_lines(1)
            .light_line_style(RGBColor(238, 238, 238))
            .label_style((FONT, 16))
            .axis_desc_style((FONT, 17))
            .draw()
            .map_err(draw_error)?;
        if let Some(t) = metric.target {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(0.0, t), (x_max, t)],
                    8,
                    5,
                    SLA_LINE.stroke_width(2),
                ))
                .map_err(draw_error)?;
        }
        for run in runs {
            let c = colour(&run.policy);
            let mut above = Vec::new();
            let points = run.intervals.iter().map(|i| {
                let x = i.start_s / 60.0 + self.interval_s / 120.0;
                let y = (metric.value)(i);
                if y > cap * (1.0 + 1e-9) {
                    above.push(x);
                    (x, cap)
                } else if metric.log && y <= 0.0 {
                    (x, f64::NAN)
                } else {
                    (x, y)
                }
            });
            let lines = segments(points);
            for segment in lines {
                chart
                    .draw_series(LineSeries::new(segment, c.stroke_width(width(&run.policy))))
                    .map_err(draw_error)?;
            }
            chart
                .draw_series(
                    above
                        .into_iter()
                        .map(|x| TriangleMarker::new((x, cap), 7, c.filled())),
                )
                .map_err(draw_error)?;
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

    /// The figure as PNG bytes.
    pub fn render_png(&self) -> Result<Vec<u8>, PlotError> {
        super::render_png(self)
    }

    /// The figure as an SVG document.
    pub fn render_svg(&self) -> Result<String, PlotError> {
        super::render_svg(self)
    }
}

/// The oracle's line is the thickest: the others are read against it.
fn width(policy: &str) -> u32 {
    if policy == "oracle" { 3 } else { 2 }
}

impl Canvas for Figure<'_> {
    fn size(&self) -> (u32, u32) {
        (WIDTH, HEIGHT)
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<()> {
        self.draw(root)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sim::run::Summary;

    #[test]
    fn nan_breaks_lines() {
        let s = segments([(0.0, 1.0), (1.0, f64::NAN), (2.0, 2.0), (3.0, 3.0)].into_iter());
        assert_eq!(s, vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]);
        assert!(segments([(0.0, f64::NAN)].into_iter()).is_empty());
    }

    #[test]
    fn log_axes_label_decades() {
        let (bold, light) = log_key_points(40.0, 65_000.0);
        assert_eq!(bold, [100.0, 1000.0, 10_000.0]);
        assert!(light.contains(&50.0) && light.contains(&20_000.0));
        let (bold, _) = log_key_points(15.0, 900.0);
        assert_eq!(bold, [20.0, 50.0, 100.0, 200.0, 500.0]);
    }

    fn run(policy: &str, ttft_ms: f64) -> RunResult {
        let interval = IntervalRecord {
            start_s: 0.0,
            arrivals: 10,
            mean_isl: 1000.0,
            mean_osl: 100.0,
            prefill: 1.0,
            decode: 1.0,
            gpus: 8.0,
            prefill_serving: 1.0,
            decode_serving: 1.0,
            ttft_ms,
            itl_ms: 20.0,
        };
        RunResult {
            policy: policy.into(),
            intervals: vec![interval; 3],
            summary: Summary {
                gpu_hours: 1.0,
                intervals: 3,
                intervals_meeting: 3,
                requests: 30,
                requests_meeting_ttft: 30,
                requests_meeting_itl: 30,
                requests_meeting_both: 30,
                requests_unfinished: 0,
                scaling_actions: 0,
                max_prefill: 1,
                max_decode: 1,
                mean_ttft_ms: ttft_ms,
                p90_ttft_ms: ttft_ms,
                p95_ttft_ms: ttft_ms,
                intervals_meeting_p90: 3,
                mean_itl_ms: 20.0,
            },
            initial: (1, 1),
            decisions: Vec::new(),
        }
    }

    #[test]
    fn the_timeline_draws_the_oracle_the_default_the_hpa_and_the_fixed_pool() {
        let results = [
            run("oracle", 100.0),
            run("sla-constant", 100.0),
            run("fixed-peak", 100.0),
            run("sla-arima", 100.0),
            run("upstream-arima", 1e6),
            run("hpa", 100.0),
        ];
        let figure = Figure {
            title: "t".into(),
            results: &results,
            sla: SlaTargets::new(500.0, 50.0),
            interval_s: 60.0,
        };
        let drawn: Vec<&str> = figure.drawn().iter().map(|r| r.policy.as_str()).collect();
        assert_eq!(drawn, TIMELINE_POLICIES);
        // The policy left out does not stretch or clip the TTFT axis.
        let cap = figure.ttft_cap(&figure.drawn());
        assert_eq!(cap, 1000.0);
        assert!(!figure.clipped(&figure.drawn(), cap));
        let svg = figure.render_svg().unwrap();
        assert!(svg.contains("sla-arima") && svg.contains("SLA target"), "{svg}");
        assert!(!svg.contains("upstream-arima") && !svg.contains("sla-constant"));
        // Without any of them, every run is drawn.
        let others = [run("oracle", 100.0), run("sla-kalman", 1e6)];
        let figure = Figure {
            results: &others,
            ..figure
        };
        assert_eq!(figure.drawn().len(), 2);
        let cap = figure.ttft_cap(&figure.drawn());
        assert_eq!(cap, 50_000.0);
        assert!(figure.clipped(&figure.drawn(), cap));
        assert!(figure.render_svg().unwrap().contains("TTFT above 50k ms"));
    }
}
