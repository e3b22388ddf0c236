//! Figures of a comparison, rendered with plotters to PNG (bitmap backend, DejaVu Sans embedded
//! through ab_glyph: no system fonts) and SVG:
//! - [`Figure`] ([`timeline`]): one run over time: arriving load, GPUs asked for, and the cohort
//!   TTFT and ITL against the SLA, for the oracle, the default policy, the HPA and the fixed pool.
//! - [`Tradeoff`] ([`tradeoff`]): GPU-hours against the share of intervals meeting the SLA, one
//!   point per policy, for one run or for every run of a comparison as small multiples.
//!
//! Every policy has one colour, chosen by its name ([`colour`]), in every figure.

pub mod timeline;
pub mod tradeoff;

use std::path::{Path, PathBuf};

use plotters::{
    coord::Shift,
    prelude::*,
    style::{FontStyle, register_font},
};

pub use self::{
    timeline::Figure,
    tradeoff::{Point, Tradeoff},
};

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

pub(crate) const FONT: &str = "sans-serif";

pub(crate) type DrawResult<T> = Result<T, PlotError>;

pub(crate) fn draw_error<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
}

fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok =
        *REGISTERED.get_or_init(|| register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok());
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// The policies the timelines draw (the others are in the tables and the trade-off figures):
/// the lower bound, the default policy, the HPA baseline and the fixed pool sized for the peak.
pub const TIMELINE_POLICIES: [&str; 4] = ["oracle", "sla-arima", "hpa", "fixed-peak"];

/// Colours of policies no entry of [`colour`] names, picked by a hash of the name.
const SPARE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

/// A policy's colour, by its name: the same in every figure whatever the policies around it.
/// The four a timeline draws are Okabe-Ito colours (distinguishable with every common colour
/// vision deficiency): the oracle black, `sla-arima` blue, `hpa` vermillion, `fixed-peak`
/// bluish green. The other Okabe-Ito hues go to the other baselines, shades of blue to the
/// other `sla-*` predictors, earth tones to upstream's formulas and greens and reds to their
/// `-u70` variants (trade-off figures also label every point); a `-nocorr` variant is its
/// parent's colour lightened.
pub fn colour(policy: &str) -> RGBColor {
    match policy {
        "oracle" => RGBColor(0, 0, 0),
        "sla-arima" => RGBColor(0, 114, 178),
        "hpa" => RGBColor(213, 94, 0),
        "fixed-peak" => RGBColor(0, 158, 115),
        "load-based" => RGBColor(204, 121, 167),
        "perfect-prediction" => RGBColor(230, 159, 0),
        "sla-constant" => RGBColor(86, 180, 233),
        "sla-kalman" => RGBColor(29, 53, 110),
        "sla-prophet" => RGBColor(117, 112, 179),
        "upstream-constant" => RGBColor(140, 86, 75),
        "upstream-arima" => RGBColor(166, 118, 29),
        "upstream-kalman" => RGBColor(110, 110, 110),
        "upstream-prophet" => RGBColor(84, 48, 5),
        "upstream-constant-u70" => RGBColor(161, 161, 20),
        "upstream-arima-u70" => RGBColor(77, 146, 33),
        "upstream-kalman-u70" => RGBColor(128, 20, 60),
        "upstream-prophet-u70" => RGBColor(240, 200, 0),
        // Dynamo's offline replay.
        "sla-arima-capped" => RGBColor(107, 174, 214),
        "oracle-schedule" => RGBColor(90, 90, 90),
        "dynamo-throughput" => RGBColor(118, 185, 0),
        "dynamo-latency" => RGBColor(60, 100, 0),
        "dynamo-load" => RGBColor(184, 134, 11),
        other => match other.find("-nocorr") {
            Some(at) => {
                let parent = format!("{}{}", &other[..at], &other[at + "-nocorr".len()..]);
                lighten(colour(&parent), 0.45)
            }
            None => SPARE[(fnv1a(other) % SPARE.len() as u64) as usize],
        },
    }
}

fn lighten(c: RGBColor, by: f64) -> RGBColor {
    let mix = |v: u8| (f64::from(v) + (255.0 - f64::from(v)) * by).round() as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A tick label: `1k`, `20k` rather than `1000.0`, `20000.0`; whole numbers without decimals,
/// others with the fewest decimals (at most two) that show them.
pub fn tick(value: f64) -> String {
    if !value.is_finite() {
        return String::new();
    }
    let trim = |text: String| {
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    };
    let magnitude = value.abs();
    if magnitude >= 1e6 {
        format!("{}M", trim(format!("{:.1}", value / 1e6)))
    } else if magnitude >= 1e3 {
        format!("{}k", trim(format!("{:.1}", value / 1e3)))
    } else if magnitude >= 10.0 {
        format!("{value:.0}")
    } else {
        trim(format!("{value:.2}"))
    }
}

/// How a legend entry is drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Swatch {
    /// A solid line of this width.
    Line(RGBColor, u32),
    /// A dashed line.
    Dashed(RGBColor),
    /// A filled circle.
    Dot(RGBColor),
    /// A filled triangle (a value above the axis).
    Triangle(RGBColor),
}

impl Swatch {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>, (x, y): (i32, i32)) -> DrawResult<()> {
        match *self {
            Self::Line(c, width) => area.draw(&PathElement::new(
                vec![(x, y), (x + SWATCH_W, y)],
                c.stroke_width(width),
            )),
            Self::Dashed(c) => {
                for start in [0, 10, 20] {
                    area.draw(&PathElement::new(
                        vec![(x + start, y), (x + start + 6, y)],
                        c.stroke_width(2),
                    ))
                    .map_err(draw_error)?;
                }
                Ok(())
            }
            Self::Dot(c) => area.draw(&Circle::new((x + SWATCH_W / 2, y), 6, c.filled())),
            Self::Triangle(c) => area.draw(&TriangleMarker::new((x + SWATCH_W / 2, y), 7, c.filled())),
        }
        .map_err(draw_error)
    }
}

const SWATCH_W: i32 = 26;

/// A row-wrapped legend drawn outside the data: where each entry goes, and the height.
pub(crate) struct Legend {
    entries: Vec<(Swatch, String)>,
    places: Vec<(i32, i32)>,
    pub(crate) height: u32,
    font: u32,
}

impl Legend {
    /// Lays `entries` out in rows of at most `width` pixels.
    pub(crate) fn layout<DB: DrawingBackend>(
        area: &DrawingArea<DB, Shift>,
        entries: Vec<(Swatch, String)>,
        width: u32,
        font: u32,
    ) -> DrawResult<Self> {
        let style = (FONT, font).into_text_style(area);
        let row_h = font as i32 + 12;
        let (mut x, mut y) = (0, row_h / 2);
        let mut places = Vec::with_capacity(entries.len());
        for (_, label) in &entries {
            let (w, _) = area.estimate_text_size(label, &style).map_err(draw_error)?;
            let entry_w = SWATCH_W + 8 + w as i32 + 24;
            if x > 0 && x + entry_w > width as i32 {
                x = 0;
                y += row_h;
            }
            places.push((x, y));
            x += entry_w;
        }
        let height = if entries.is_empty() {
            0
        } else {
            (y + row_h / 2 + 4) as u32
        };
        Ok(Self {
            entries,
            places,
            height,
            font,
        })
    }

    /// Draws the legend at `origin` of `area`.
    pub(crate) fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        origin: (i32, i32),
    ) -> DrawResult<()> {
        let style = (FONT, self.font)
            .into_text_style(area)
            .pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Left,
                plotters::style::text_anchor::VPos::Center,
            ));
        for ((swatch, label), (x, y)) in self.entries.iter().zip(&self.places) {
            let (x, y) = (origin.0 + x, origin.1 + y);
            swatch.draw(area, (x, y))?;
            area.draw(&Text::new(label.clone(), (x + SWATCH_W + 8, y), style.clone()))
                .map_err(draw_error)?;
        }
        Ok(())
    }
}

/// `text` in lines of at most `width` pixels, broken after commas and semicolons.
pub(crate) fn wrap<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    style: &TextStyle,
    width: u32,
) -> DrawResult<Vec<String>> {
    let mut lines: Vec<String> = Vec::new();
    let mut current = String::new();
    for piece in text.split_inclusive([',', ';']) {
        let candidate = format!("{current}{piece}");
        let (w, _) = area
            .estimate_text_size(candidate.trim(), style)
            .map_err(draw_error)?;
        if w > width && !current.trim().is_empty() {
            lines.push(current.trim().to_string());
            current = piece.to_string();
        } else {
            current = candidate;
        }
    }
    if !current.trim().is_empty() {
        lines.push(current.trim().to_string());
    }
    Ok(lines)
}

/// Draws a title of one or more lines; returns the height it took.
pub(crate) fn draw_title<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    lines: &[String],
    font: u32,
    origin: (i32, i32),
) -> DrawResult<i32> {
    let style = (FONT, font).into_text_style(area);
    let line_h = font as i32 + 8;
    for (i, line) in lines.iter().enumerate() {
        area.draw(&Text::new(
            line.clone(),
            (origin.0, origin.1 + i as i32 * line_h),
            style.clone(),
        ))
        .map_err(draw_error)?;
    }
    Ok(lines.len() as i32 * line_h)
}

/// What a figure needs to be written as PNG and SVG.
pub(crate) trait Canvas {
    /// Width and height in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws the figure on `root`.
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<()>;
}

/// Writes `<stem>.png` and `<stem>.svg` of `figure` in `dir`; returns their paths.
pub(crate) fn write_figure<F: Canvas>(
    figure: &F,
    dir: &Path,
    stem: &str,
) -> Result<(PathBuf, PathBuf), PlotError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(|source| PlotError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let png_path = dir.join(format!("{stem}.png"));
    let svg_path = dir.join(format!("{stem}.svg"));
    let png = render_png(figure)?;
    std::fs::write(&png_path, png).map_err(|source| PlotError::Io {
        path: png_path.display().to_string(),
        source,
    })?;
    let svg = render_svg(figure)?;
    std::fs::write(&svg_path, svg).map_err(|source| PlotError::Io {
        path: svg_path.display().to_string(),
        source,
    })?;
    Ok((png_path, svg_path))
}

/// `figure` as PNG bytes.
pub(crate) fn render_png<F: Canvas>(figure: &F) -> Result<Vec<u8>, PlotError> {
    ensure_font()?;
    let (width, height) = figure.size();
    let mut pixels = vec![0u8; (width * height * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        figure.draw_on(&root)?;
        root.present().map_err(draw_error)?;
    }
    let mut bytes = Vec::new();
    let encode = |e: png::EncodingError| PlotError::Encode {
        path: "PNG".into(),
        reason: e.to_string(),
    };
    {
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_compression(png::Compression::High);
        let mut writer = encoder.write_header().map_err(encode)?;
        writer.write_image_data(&pixels).map_err(encode)?;
        writer.finish().map_err(encode)?;
    }
    Ok(bytes)
}

/// `figure` as an SVG document.
pub(crate) fn render_svg<F: Canvas>(figure: &F) -> Result<String, PlotError> {
    ensure_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, figure.size()).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        figure.draw_on(&root)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::policy::PolicySpec;

    #[test]
    fn colours_are_fixed_by_name_and_tell_the_policies_apart() {
        // By name, not by position: the same whatever was asked for before.
        let names = PolicySpec::names();
        let first: Vec<RGBColor> = names.iter().map(|n| colour(n)).collect();
        let reversed: Vec<RGBColor> = names.iter().rev().map(|n| colour(n)).collect();
        assert_eq!(first, reversed.into_iter().rev().collect::<Vec<_>>());
        // The timeline's four are Okabe-Ito's black, blue, vermillion and bluish green.
        assert_eq!(colour("oracle"), RGBColor(0, 0, 0));
        assert_eq!(colour("sla-arima"), RGBColor(0, 114, 178));
        assert_eq!(colour("hpa"), RGBColor(213, 94, 0));
        assert_eq!(colour("fixed-peak"), RGBColor(0, 158, 115));
        // Every standard policy has a colour of its own, none of them a spare.
        for (i, a) in names.iter().enumerate() {
            assert!(!SPARE.contains(&colour(a)), "{a} has no colour of its own");
            for b in &names[i + 1..] {
                assert_ne!(colour(a), colour(b), "{a} and {b}");
            }
        }
        assert_eq!(
            colour("upstream-arima-nocorr"),
            lighten(colour("upstream-arima"), 0.45)
        );
        assert_eq!(
            colour("upstream-arima-nocorr-u70"),
            lighten(colour("upstream-arima-u70"), 0.45)
        );
        assert_eq!(colour("someone-else"), colour("someone-else"));
    }

    #[test]
    fn ticks_read_as_numbers() {
        assert_eq!(tick(10000.0), "10k");
        assert_eq!(tick(1500.0), "1.5k");
        assert_eq!(tick(2_000_000.0), "2M");
        assert_eq!(tick(500.0), "500");
        assert_eq!(tick(50.0), "50");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(f64::NAN), "");
    }
}
