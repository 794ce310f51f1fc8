//! One SVG chart per suite: a panel per metric, build variant and mode, each with its own unit
//! and a linear scale (ratios read off directly), a bar per case and CPU variant, min..max
//! whiskers where reps differ.

use super::Mode;
use super::results::Row;
use crate::qemu::CpuVariant;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const COLORS: [RGBColor; 5] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x7f, 0x7f, 0x7f),
];

const WIDTH: u32 = 1100;
const LABEL_WIDTH: u32 = 270;
/// Pixels per bar, and between one case's bars and the next case's.
const BAR: u32 = 7;
const GAP: u32 = 8;
/// Caption, x axis and margins of one panel.
const PANEL_FRAME: u32 = 90;
/// The strip above the panels that names the CPU variants' colours.
const LEGEND: u32 = 32;

/// A panel: one metric of one build variant in one mode.
struct Panel<'a> {
    title: String,
    unit: String,
    rows: Vec<&'a Row>,
    labels: Vec<String>,
    cpus: Vec<CpuVariant>,
}

impl Panel<'_> {
    fn height(&self) -> u32 {
        PANEL_FRAME + self.labels.len() as u32 * (self.cpus.len() as u32 * BAR + GAP)
    }
}

fn panels<'a>(suite: &str, rows: &'a [Row]) -> Vec<Panel<'a>> {
    let rows: Vec<&Row> = rows.iter().filter(|row| row.suite == suite).collect();
    let mut keys: Vec<(&str, &str, Mode)> = Vec::new();
    for row in &rows {
        let key = (row.metric.as_str(), row.variant.name(), row.mode);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(metric, variant, mode)| {
            let in_panel: Vec<&Row> = rows
                .iter()
                .copied()
                .filter(|row| row.metric == metric && row.variant.name() == variant && row.mode == mode)
                .collect();
            // A case's bars together (fp 4, 8, 16, then scs 4, 8, 16), as in report.md.
            let mut cases: Vec<&str> = Vec::new();
            let mut labels: Vec<(usize, String)> = Vec::new();
            for row in &in_panel {
                if !cases.contains(&row.case.as_str()) {
                    cases.push(&row.case);
                }
                let case = cases.iter().position(|case| *case == row.case).unwrap_or(0);
                if !labels.iter().any(|(_, label)| *label == row.label()) {
                    labels.push((case, row.label()));
                }
            }
            labels.sort_by_key(|(case, _)| *case);
            let labels = labels.into_iter().map(|(_, label)| label).collect();
            let cpus = CpuVariant::ALL.into_iter().filter(|cpu| in_panel.iter().any(|row| row.cpu == *cpu)).collect();
            let unit = in_panel.first().map(|row| row.unit.clone()).unwrap_or_default();
            Panel {
                title: format!("{suite}: {metric} ({unit}), variant {variant}, mode {}", mode.name()),
                unit,
                rows: in_panel,
                labels,
                cpus,
            }
        })
        .collect()
}

fn color(cpu: CpuVariant) -> RGBColor {
    COLORS[CpuVariant::ALL.iter().position(|known| *known == cpu).unwrap_or(0)]
}

pub fn draw(path: &Path, suite: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let panels = panels(suite, rows);
    let height = LEGEND + panels.iter().map(Panel::height).sum::<u32>();
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    // One legend for the whole chart, above the panels, so no bar hides behind it.
    let (legend, mut rest) = root.split_vertically(LEGEND);
    let cpus = CpuVariant::ALL.into_iter().filter(|cpu| rows.iter().any(|row| row.suite == suite && row.cpu == *cpu));
    let style = TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let mut x = LABEL_WIDTH as i32;
    for cpu in cpus {
        legend.draw(&Rectangle::new([(x, 10), (x + 12, 22)], color(cpu).filled()))?;
        legend.draw(&Text::new(cpu.name(), (x + 18, 16), style.clone()))?;
        x += 30 + 8 * cpu.name().len() as i32;
    }
    for panel in &panels {
        let (area, below) = rest.split_vertically(panel.height());
        rest = below;
        draw_panel(&root, &area, panel)?;
    }
    root.present()?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let low = panel.rows.iter().map(|row| row.min).fold(0.0_f64, f64::min);
    let high = panel.rows.iter().map(|row| row.max).fold(0.0_f64, f64::max);
    let span = if high > low { high - low } else { 1.0 };
    let slots = panel.labels.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(LABEL_WIDTH)
        .build_cartesian_2d(low..high + span * 0.05, 0.0..slots)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_label_formatter(&|value| super::report::number(*value))
        .x_label_style(("sans-serif", 11))
        .x_desc(panel.unit.as_str())
        .draw()?;
    // Case names beside their bars, drawn on the whole image at the chart's pixel positions:
    // plotters' numeric axis would place labels at round numbers, not at the cases.
    let style = TextStyle::from(("sans-serif", 11).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (index, label) in panel.labels.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(low, slots - index as f64 - 0.5));
        root.draw(&Text::new(label.clone(), (x - 6, y), style.clone()))?;
    }
    let per_bar = 0.85 / panel.cpus.len().max(1) as f64;
    for cpu in &panel.cpus {
        let color = color(*cpu);
        let slot_of = |row: &Row| panel.labels.iter().position(|label| *label == row.label());
        let place = |row: &Row| {
            let slot = slot_of(row)? as f64;
            let index = panel.cpus.iter().position(|known| known == cpu)? as f64;
            let top = slots - slot - 0.075 - index * per_bar;
            Some((top - per_bar * 0.9, top))
        };
        let in_cpu: Vec<&Row> = panel.rows.iter().copied().filter(|row| row.cpu == *cpu).collect();
        let bars: Vec<_> = in_cpu
            .iter()
            .filter_map(|row| {
                let (bottom, top) = place(row)?;
                Some(Rectangle::new([(0.0_f64.max(low), bottom), (row.median, top)], color.filled()))
            })
            .collect();
        if bars.is_empty() {
            continue;
        }
        chart.draw_series(bars)?;
        let whiskers: Vec<_> = in_cpu
            .iter()
            .filter(|row| row.min < row.max)
            .filter_map(|row| {
                let (bottom, top) = place(row)?;
                let middle = (bottom + top) / 2.0;
                Some(PathElement::new(vec![(row.min, middle), (row.max, middle)], BLACK.stroke_width(1)))
            })
            .collect();
        chart.draw_series(whiskers)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::tests::rows;

    #[test]
    fn each_metric_and_mode_gets_its_own_panel_and_unit() {
        let mut all = rows(
            &[
                "probes kprobe-nop method=simulate per_hit insn 120",
                "probes kprobe-nop method=simulate hits_per_s hits_per_s 8000000",
                "probes kernel-call-nop - per_call insn 2",
            ],
            Mode::Icount,
        );
        all.extend(rows(&["probes kprobe-nop method=simulate per_hit ns 300"], Mode::Wall));
        let panels = panels("probes", &all);
        let units: Vec<(&str, &str)> =
            panels.iter().map(|panel| (panel.title.split(':').nth(1).unwrap_or(""), panel.unit.as_str())).collect();
        assert_eq!(units.len(), 4, "{units:?}");
        assert!(panels.iter().all(|panel| panel.rows.iter().all(|row| row.unit == panel.unit)));
        let path = std::env::temp_dir().join(format!("tracelab-chart-{}.svg", std::process::id()));
        draw(&path, "probes", &all).expect("draws");
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("kprobe-nop method=simulate") && svg.contains("per_hit (ns)"));
        std::fs::remove_file(&path).unwrap();
    }
}
