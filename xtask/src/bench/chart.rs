//! One SVG chart per suite: median per case and CPU variant, a panel per mode, log scale.

use super::Mode;
use super::results::Row;
use crate::qemu::CpuVariant;
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 5] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x7f, 0x7f, 0x7f),
];

pub fn draw(path: &Path, suite: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let rows: Vec<&Row> = rows.iter().filter(|row| row.suite == suite).collect();
    let mut labels: Vec<String> = Vec::new();
    for row in &rows {
        let label =
            if row.params.is_empty() { row.case.clone() } else { format!("{} {}", row.case, row.params_text()) };
        if !labels.contains(&label) {
            labels.push(label);
        }
    }
    let modes: Vec<Mode> =
        [Mode::Icount, Mode::Wall].into_iter().filter(|&mode| rows.iter().any(|row| row.mode == mode)).collect();
    let root = SVGBackend::new(path, (1100, 420 * modes.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((modes.len().max(1), 1));
    for (panel, mode) in panels.iter().zip(&modes) {
        let in_mode: Vec<&&Row> = rows.iter().filter(|row| row.mode == *mode).collect();
        let unit = in_mode.first().map(|row| row.unit.clone()).unwrap_or_default();
        let top = in_mode.iter().map(|row| row.median).fold(1.0_f64, f64::max) * 2.0;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{suite}: median per case, mode {} ({unit}, log scale)", mode.name()), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..labels.len() as f64, (0.1_f64..top).log_scale())?;
        let label_names = labels.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(labels.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let index = (*x - 0.5).round();
                if (*x - 0.5 - index).abs() < 1e-6 && index >= 0.0 {
                    label_names.get(index as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc(unit)
            .draw()?;
        let width = 0.8 / CpuVariant::ALL.len() as f64;
        for (cpu_index, cpu) in CpuVariant::ALL.iter().enumerate() {
            let color = COLORS[cpu_index];
            let bars: Vec<_> = in_mode
                .iter()
                .filter(|row| row.cpu == *cpu)
                .filter_map(|row| {
                    let label = if row.params.is_empty() {
                        row.case.clone()
                    } else {
                        format!("{} {}", row.case, row.params_text())
                    };
                    let index = labels.iter().position(|existing| *existing == label)? as f64;
                    let left = index + 0.1 + cpu_index as f64 * width;
                    Some(Rectangle::new([(left, 0.1), (left + width * 0.9, row.median.max(0.1))], color.filled()))
                })
                .collect();
            if bars.is_empty() {
                continue;
            }
            chart
                .draw_series(bars)?
                .label(cpu.name())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
