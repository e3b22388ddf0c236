//! Figures of a comparison: arriving load, GPUs asked for, and the cohort TTFT and ITL
//! against the SLA, per interval, one line per policy. Rendered with plotters to PNG (bitmap
//! backend, DejaVu Sans embedded through ab_glyph: no system fonts) and SVG.

use std::path::Path;

use plotters::{
    coord::Shift,
    prelude::*,
    style::{FontStyle, register_font},
};

use planner_core::sla::SlaTargets;

use super::run::RunResult;

/// Why a figure could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The embedded font could not be registered.
    #[error("cannot load the embedded plot font")]
    Font,
    /// plotters failed while drawing.
    #[error("cannot draw the figure: {0}")]
    Draw(String),
    /// PNG encoding failed.
    #[error("cannot encode {path}: {reason}")]
    Encode {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

const FONT: &str = "sans-serif";
const WIDTH: u32 = 1400;
const HEIGHT: u32 = 1500;

fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok =
        *REGISTERED.get_or_init(|| register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok());
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// A line colour per policy, the oracle in black.
fn colour(index: usize, policy: &str) -> RGBColor {
    const PALETTE: [RGBColor; 12] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(174, 199, 232),
        RGBColor(255, 187, 120),
    ];
    if policy == "oracle" {
        BLACK
    } else {
        PALETTE[index % PALETTE.len()]
    }
}

/// What the figure shows.
pub struct Figure<'a> {
    /// Title (trace, rate scale, profile).
    pub title: String,
    /// The runs (the oracle among them).
    pub results: &'a [RunResult],
    /// Targets drawn as dashed lines.
    pub sla: SlaTargets,
    /// Interval length (s), for the request rate.
    pub interval_s: f64,
}

type DrawResult<T> = Result<T, PlotError>;

fn draw_error<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
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

impl Figure<'_> {
    fn minutes(&self) -> f64 {
        self.results
            .iter()
            .filter_map(|r| r.intervals.last())
            .map(|i| (i.start_s + self.interval_s) / 60.0)
            .fold(1.0, f64::max)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<()> {
        root.fill(&WHITE).map_err(draw_error)?;
        let (title, body) = root.split_vertically(50);
        title
            .draw_text(&self.title, &(FONT, 26).into_text_style(&title), (20, 12))
            .map_err(draw_error)?;
        let panels = body.split_evenly((4, 1));
        let x_max = self.minutes();
        self.draw_load(&panels[0], x_max)?;
        self.draw_metric(&panels[1], x_max, "GPUs asked for", |i| i.gpus, None, false, true)?;
        self.draw_metric(
            &panels[2],
            x_max,
            "TTFT of the interval's arrivals (ms, log)",
            |i| i.ttft_ms,
            Some(self.sla.ttft_ms),
            true,
            false,
        )?;
        self.draw_metric(
            &panels[3],
            x_max,
            "ITL of the interval's arrivals (ms)",
            |i| i.itl_ms,
            Some(self.sla.itl_ms),
            false,
            false,
        )?;
        root.present().map_err(draw_error)
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
        let y_max = rate.iter().chain(&tokens).map(|p| p.1).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption("Arriving load", (FONT, 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .x_desc("minutes")
            .light_line_style(RGBColor(242, 242, 242))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(draw_error)?;
        let step = |points: &[(f64, f64)]| -> Vec<(f64, f64)> {
            points
                .iter()
                .flat_map(|&(x, y)| [(x, y), (x + self.interval_s / 60.0, y)])
                .collect()
        };
        chart
            .draw_series(LineSeries::new(step(&rate), BLUE.stroke_width(2)))
            .map_err(draw_error)?
            .label("requests/s")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(step(&tokens), RED.stroke_width(2)))
            .map_err(draw_error)?
            .label("prompt tokens/s (thousands)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()
            .map_err(draw_error)
    }

    #[allow(clippy::too_many_arguments)]
    fn draw_metric<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        x_max: f64,
        caption: &str,
        value: fn(&super::run::IntervalRecord) -> f64,
        target: Option<f64>,
        log: bool,
        legend: bool,
    ) -> DrawResult<()> {
        let values = || {
            self.results
                .iter()
                .flat_map(|r| r.intervals.iter().map(value))
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        let data_max = values().fold(0.0, f64::max).max(target.unwrap_or(0.0));
        let data_min = values().fold(f64::INFINITY, f64::min);
        // Saturated intervals are drawn at the top of the plot rather than off it.
        let cap = match target {
            Some(t) if log => (t * 100.0).min(data_max.max(t * 2.0)),
            _ => data_max,
        }
        .max(1.0);
        let clamp = |v: f64| if v.is_infinite() { cap } else { v.min(cap) };
        let mut area_chart = ChartBuilder::on(area);
        area_chart
            .caption(caption, (FONT, 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70);
        let x_range = 0.0..x_max;
        macro_rules! finish {
            ($chart:ident) => {{
                $chart
                    .configure_mesh()
                    .x_desc("minutes")
                    .light_line_style(RGBColor(242, 242, 242))
                    .label_style((FONT, 14))
                    .axis_desc_style((FONT, 15))
                    .draw()
                    .map_err(draw_error)?;
                if let Some(t) = target {
                    $chart
                        .draw_series(DashedLineSeries::new(
                            vec![(0.0, t), (x_max, t)],
                            8,
                            5,
                            BLACK.stroke_width(2),
                        ))
                        .map_err(draw_error)?
                        .label("SLA target")
                        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
                }
                for (index, run) in self.results.iter().enumerate() {
                    let colour = colour(index, &run.policy);
                    let width = if run.policy == "oracle" { 3 } else { 2 };
                    let points = run
                        .intervals
                        .iter()
                        .map(|i| (i.start_s / 60.0 + self.interval_s / 120.0, value(i)))
                        .map(|(x, y)| (x, if y.is_nan() { y } else { clamp(y) }))
                        .map(|(x, y)| (x, if log && y <= 0.0 { f64::NAN } else { y }));
                    let mut first = true;
                    for segment in segments(points) {
                        let series = $chart
                            .draw_series(LineSeries::new(segment, colour.stroke_width(width)))
                            .map_err(draw_error)?;
                        if first && legend {
                            series.label(run.policy.clone()).legend(move |(x, y)| {
                                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(width))
                            });
                        }
                        first = false;
                    }
                }
                if legend || target.is_some() {
                    $chart
                        .configure_series_labels()
                        .position(SeriesLabelPosition::UpperRight)
                        .background_style(WHITE.mix(0.85))
                        .border_style(BLACK)
                        .label_font((FONT, 13))
                        .draw()
                        .map_err(draw_error)?;
                }
            }};
        }
        if log {
            let low = if data_min.is_finite() {
                (data_min * 0.8).max(1e-3)
            } else {
                1.0
            };
            let mut chart = area_chart
                .build_cartesian_2d(x_range, (low..cap * 1.2).log_scale())
                .map_err(draw_error)?;
            finish!(chart);
        } else {
            let mut chart = area_chart
                .build_cartesian_2d(x_range, 0.0..cap * 1.1)
                .map_err(draw_error)?;
            finish!(chart);
        }
        Ok(())
    }

    /// Writes `<stem>.png` and `<stem>.svg` in `dir`; returns their paths.
    pub fn write(
        &self,
        dir: &Path,
        stem: &str,
    ) -> Result<(std::path::PathBuf, std::path::PathBuf), PlotError> {
        ensure_font()?;
        std::fs::create_dir_all(dir).map_err(|source| PlotError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let png_path = dir.join(format!("{stem}.png"));
        let svg_path = dir.join(format!("{stem}.svg"));
        let png = self.render_png()?;
        std::fs::write(&png_path, png).map_err(|source| PlotError::Io {
            path: png_path.display().to_string(),
            source,
        })?;
        let svg = self.render_svg()?;
        std::fs::write(&svg_path, svg).map_err(|source| PlotError::Io {
            path: svg_path.display().to_string(),
            source,
        })?;
        Ok((png_path, svg_path))
    }

    /// The figure as PNG bytes.
    pub fn render_png(&self) -> Result<Vec<u8>, PlotError> {
        ensure_font()?;
        let mut pixels = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut pixels, (WIDTH, HEIGHT)).into_drawing_area();
            self.draw(&root)?;
        }
        let mut bytes = Vec::new();
        let encode = |e: png::EncodingError| PlotError::Encode {
            path: "PNG".into(),
            reason: e.to_string(),
        };
        {
            let mut encoder = png::Encoder::new(&mut bytes, WIDTH, HEIGHT);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            encoder.set_compression(png::Compression::High);
            let mut writer = encoder.write_header().map_err(encode)?;
            writer.write_image_data(&pixels).map_err(encode)?;
            writer.finish().map_err(encode)?;
        }
        Ok(bytes)
    }

    /// The figure as an SVG document.
    pub fn render_svg(&self) -> Result<String, PlotError> {
        ensure_font()?;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
            self.draw(&root)?;
        }
        Ok(svg)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nan_breaks_lines() {
        let s = segments([(0.0, 1.0), (1.0, f64::NAN), (2.0, 2.0), (3.0, 3.0)].into_iter());
        assert_eq!(s, vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]);
        assert!(segments([(0.0, f64::NAN)].into_iter()).is_empty());
    }
}
