//! SVG charts with `plotters` (SVG backend only: text is emitted as SVG `<text>`, so no
//! system font is needed): control-plane latency percentiles, and the host-port scaling
//! curve.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::{coord::types::RangedCoordf64, prelude::*};

/// Colour of each column.
fn colour(col: &str) -> RGBColor {
    match col {
        "cni-ebpf" => RGBColor(0x1f, 0x77, 0xb4),
        "reference" => RGBColor(0xd6, 0x27, 0x28),
        _ => RGBColor(0x7f, 0x7f, 0x7f),
    }
}

/// One group of bars: a label and a value per series.
pub struct Group {
    /// Below the group.
    pub label: String,
    /// (series, value).
    pub bars: Vec<(String, f64)>,
}

impl Group {
    /// A group of `values` divided by their `"reference"` entry (the reference chain = 1);
    /// `None` without a positive reference value.
    pub fn relative(
        label: String,
        values: &std::collections::BTreeMap<String, f64>,
    ) -> Option<Self> {
        let reference = values.get("reference").copied().filter(|r| *r > 0.0)?;
        Some(Self {
            label,
            bars: values
                .iter()
                .map(|(k, v)| (k.clone(), v / reference))
                .collect(),
        })
    }
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e:?}")
}

/// Draws the series names in the upper left corner of `chart`.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// Grouped bars (one bar per series in each group), linear y axis from 0.
pub fn grouped_bars(
    out: &Path,
    title: &str,
    y_desc: &str,
    groups: &[Group],
    series: &[&str],
) -> Result<()> {
    let width = u32::try_from(groups.len() * 130).unwrap_or(1000).max(1000);
    let root = SVGBackend::new(out, (width, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let ymax = groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|b| b.1))
        .fold(0.0_f64, f64::max)
        * 1.15;
    let n = groups.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax.max(1e-9))
        .map_err(err)?;
    let labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            // Label only at group centres.
            if (x - (i as f64 + 0.5)).abs() < 1e-6 && i < labels.len() {
                labels[i].clone()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    let width = 0.8 / series.len().max(1) as f64;
    for (si, s) in series.iter().enumerate() {
        let c = colour(s);
        let rects: Vec<Rectangle<(f64, f64)>> = groups
            .iter()
            .enumerate()
            .filter_map(|(gi, g)| {
                let v = g.bars.iter().find(|b| b.0 == *s)?.1;
                let x0 = gi as f64 + 0.1 + si as f64 * width;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + width * 0.95, v)],
                    c.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(*s)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    legend(&mut chart)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One line of a line chart.
pub struct Line {
    /// Series name (also picks the colour by its first word).
    pub name: String,
    /// Points.
    pub points: Vec<(f64, f64)>,
    /// Dashed-looking (thin) line.
    pub thin: bool,
}

/// Adds a line of `points` to `lines`, unless it has none.
pub fn push_line(lines: &mut Vec<Line>, name: String, points: Vec<(f64, f64)>, thin: bool) {
    if !points.is_empty() {
        lines.push(Line { name, points, thin });
    }
}

/// Lines over a shared x axis, one panel per `(title, y_desc, lines)`, stacked vertically.
pub fn line_panels(out: &Path, x_desc: &str, panels: &[(String, String, Vec<Line>)]) -> Result<()> {
    let h = 380 * panels.len().max(1) as u32;
    let root = SVGBackend::new(out, (1000, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((panels.len().max(1), 1));
    for (area, (title, y_desc, lines)) in areas.iter().zip(panels) {
        let xmax = lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.0))
            .fold(0.0_f64, f64::max)
            .max(1.0);
        let ymax = lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .fold(0.0_f64, f64::max)
            .max(1e-9)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..xmax * 1.02, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
            .x_desc(x_desc)
            .y_desc(y_desc.as_str())
            .draw()
            .map_err(err)?;
        for l in lines {
            let key = l.name.split_whitespace().next().unwrap_or_default();
            let c = colour(key);
            let style = ShapeStyle {
                color: c.mix(if l.thin { 0.45 } else { 1.0 }),
                filled: false,
                stroke_width: if l.thin { 1 } else { 3 },
            };
            chart
                .draw_series(LineSeries::new(l.points.clone(), style))
                .map_err(err)?
                .label(l.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            if !l.thin {
                chart
                    .draw_series(l.points.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(err)?;
            }
        }
        legend(&mut chart)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
