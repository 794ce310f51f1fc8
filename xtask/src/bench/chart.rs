//! One SVG chart per suite: a panel per metric, build variant, mode (and CPU variant unless
//! their figures agree), a bar per case with the param that varies (method, scheme, tracer) in
//! colour and a legend, value labels, SI ticks, and values more than 20x apart in panels of
//! their own so small bars are not crushed beside large ones.

use super::Mode;
use super::report;
use super::results::Row;
use crate::qemu::CpuVariant;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// Ten colours told apart by most readers (matplotlib's tab10).
const COLORS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

const WIDTH: u32 = 1100;
const LABEL_WIDTH: u32 = 270;
/// Pixels per bar (room for its value label), and between one slot's bars and the next slot's.
const BAR: u32 = 14;
const GAP: u32 = 8;
/// A panel's title and legend lines above its plot.
const HEADER: u32 = 48;
/// The x axis and margins of one panel.
const PANEL_FRAME: u32 = 60;
/// Values of one panel stay within this factor of each other; larger ones get a panel of their
/// own (2-10 ns bars beside a 1323 ns bar would be a few pixels long).
pub const SPLIT_RATIO: f64 = 20.0;

/// The params that say how a mechanism is done, coloured in preference to the case when they
/// vary within a panel: the probe method, the counting tracer, the XOL slot strategy, the depot.
const COLOUR_PARAMS: [&str; 5] = ["method", "tracer", "slots", "depot", "traces"];

/// What the bars' colours encode in a panel.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Colour<'a> {
    /// A param (`method`): each of its values a colour; the other params and the case name a slot.
    Param(&'a str),
    /// The case (the ftrace scheme, the stack trace's way): the params name a slot.
    Case,
    /// The CPU variant, when nothing else varies.
    Cpu,
}

impl Colour<'_> {
    fn name(self) -> &'static str {
        match self {
            Colour::Param(_) => "param",
            Colour::Case => "case",
            Colour::Cpu => "CPU variant",
        }
    }

    fn value(self, row: &Row) -> String {
        match self {
            Colour::Param(key) => {
                row.params.iter().find(|(name, _)| name == key).map_or("-".into(), |(_, value)| value.clone())
            }
            Colour::Case => row.case.clone(),
            Colour::Cpu => row.cpu.name().into(),
        }
    }

    /// The slot a row's bar goes in: its label without what the colour says.
    fn slot(self, row: &Row) -> String {
        let params: Vec<String> = row
            .params
            .iter()
            .filter(|(name, _)| self != Colour::Param(name))
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        match self {
            Colour::Case if params.is_empty() => row.case.clone(),
            Colour::Case => params.join(","),
            _ if params.is_empty() => row.case.clone(),
            _ => format!("{} {}", row.case, params.join(",")),
        }
    }
}

/// A peer's figure for a row, or None where it has none.
pub type PeerFigure<'a> = Box<dyn Fn(&Row) -> Option<f64> + 'a>;

/// Figures of another system for some rows (the same operation measured elsewhere, e.g. on
/// Linux), drawn as a black mark across each bar it knows, named in the legend. The chart's
/// extension point for a peer; `draw` has none, `draw_with` takes one.
#[allow(dead_code, reason = "the chart's extension point: no caller supplies a peer yet")]
pub struct Peer<'a> {
    pub name: String,
    pub value: PeerFigure<'a>,
}

/// One bar: a row in a slot, with its colour's index.
struct Bar<'a> {
    row: &'a Row,
    slot: usize,
    series: usize,
    peer: Option<f64>,
}

/// A panel: one metric of one build variant in one mode (one CPU variant, or all when they
/// agree or are the colour), with values within `SPLIT_RATIO` of each other.
pub struct Panel<'a> {
    pub title: String,
    /// The x axis' words: the unit and how it was measured.
    pub axis: String,
    pub colour: Colour<'a>,
    /// Legend entries (the colour's values), in first-seen order.
    pub series: Vec<String>,
    pub slots: Vec<String>,
    bars: Vec<Bar<'a>>,
}

impl Panel<'_> {
    /// Bars side by side in the fullest slot.
    fn per_slot(&self) -> usize {
        (0..self.slots.len()).map(|slot| self.bars.iter().filter(|bar| bar.slot == slot).count()).max().unwrap_or(1)
    }

    fn height(&self) -> u32 {
        HEADER + PANEL_FRAME + self.slots.len() as u32 * (self.per_slot() as u32 * BAR + GAP)
    }

    /// The rows drawn, in slot order.
    #[cfg(test)]
    pub fn rows(&self) -> Vec<&Row> {
        self.bars.iter().map(|bar| bar.row).collect()
    }
}

/// The x axis' words for a unit measured in a mode: emulated time is never plain `ns`.
pub fn axis_title(mode: Mode, unit: &str) -> String {
    match (mode, unit) {
        (Mode::Wall, "ns") => "virtual ns (TCG emulation)".into(),
        (Mode::Icount, "insn") => "instructions (QEMU icount)".into(),
        (Mode::Hardware, "cycles") => "CPU cycles (hardware PMU)".into(),
        (Mode::Wall, "hits_per_s") => "hits per virtual second (TCG emulation)".into(),
        (Mode::Hardware, "hits_per_s") => "hits per second (hardware)".into(),
        (Mode::Icount, "events") => "events per operation (QEMU plugin)".into(),
        (_, unit) => unit.into(),
    }
}

/// Whether a row is charted: `hits_per_s` under icount is a rate of a synthetic clock (one
/// instruction per ns), not a speed; its `per_hit` row says the same in instructions.
pub fn charted(row: &Row) -> bool {
    !(row.mode == Mode::Icount && row.unit == "hits_per_s")
}

/// A tick or label in SI form: `12M`, `1.5k`, `250`, `0.5`.
pub fn si(value: f64) -> String {
    let magnitude = value.abs();
    let (scaled, suffix) = if magnitude >= 1e9 {
        (value / 1e9, "G")
    } else if magnitude >= 1e6 {
        (value / 1e6, "M")
    } else if magnitude >= 1e3 {
        (value / 1e3, "k")
    } else {
        return report::number(value);
    };
    // Three significant digits at most: 1.23k, 12.3M, 123G.
    let decimals = if scaled.abs() >= 100.0 {
        0
    } else if scaled.abs() >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{scaled:.decimals$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    format!("{text}{suffix}")
}

/// A bar's label: the median as its table cell shows it, in SI form from 10k up.
fn value_label(row: &Row) -> String {
    if row.median.abs() >= 10_000.0 { si(row.median) } else { report::figure(row, row.median) }
}

/// Groups of values in which the largest is at most `SPLIT_RATIO` times the smallest non-zero
/// one: each value's group index (0: the smallest values; zeros go with them). A group too wide
/// is cut where neighbouring values are furthest apart, so values close to each other stay
/// together (7 and 57 part before 511 and 1958 do).
pub fn magnitude_groups(values: &[f64]) -> Vec<usize> {
    let mut sorted: Vec<f64> = values.iter().map(|value| value.abs()).filter(|value| *value > 0.0).collect();
    sorted.sort_by(f64::total_cmp);
    let mut starts = Vec::new();
    cut(&sorted, &mut starts);
    values.iter().map(|value| starts.iter().rposition(|start| value.abs() >= *start).unwrap_or(0)).collect()
}

/// Pushes the first value of each group of `sorted` (ascending, positive) in order.
fn cut(sorted: &[f64], starts: &mut Vec<f64>) {
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else { return };
    if last <= first * SPLIT_RATIO {
        starts.push(first);
        return;
    }
    let widest = (1..sorted.len())
        .max_by(|&a, &b| (sorted[a] / sorted[a - 1]).total_cmp(&(sorted[b] / sorted[b - 1])))
        .expect("a group too wide has two values");
    cut(&sorted[..widest], starts);
    cut(&sorted[widest..], starts);
}

/// Whether a panel of this unit is split by magnitude: costs (instructions, ns, cycles), whose
/// mechanisms are compared bar against bar. Counts (records, bytes, percent, rates) describe
/// workloads of different sizes, and their ratio is what they show.
fn splits(unit: &str) -> bool {
    matches!(unit, "insn" | "ns" | "cycles")
}

/// The colour of a panel's rows: the first `COLOUR_PARAMS` param that varies, else the case
/// when it varies, else the CPU variant.
fn colour_of<'a>(rows: &[&'a Row]) -> Colour<'a> {
    for key in COLOUR_PARAMS {
        let values: Vec<&String> = rows
            .iter()
            .filter_map(|row| row.params.iter().find(|(name, _)| name == key).map(|(_, value)| value))
            .collect();
        if values.iter().any(|value| *value != values[0]) {
            return Colour::Param(key);
        }
    }
    if rows.iter().any(|row| row.case != rows[0].case) { Colour::Case } else { Colour::Cpu }
}

/// Where a row's slot stands: a case's slots together in the kernel's order of cases (unless the
/// case is the colour), then by param values, numbers as numbers (depth 4, 8, 16, not 16, 4, 8).
fn slot_order(colour: Colour, cases: &[&str], row: &Row) -> (usize, Vec<(f64, String)>) {
    let case = if colour == Colour::Case { 0 } else { cases.iter().position(|case| *case == row.case).unwrap_or(0) };
    let params = row
        .params
        .iter()
        .filter(|(name, _)| colour != Colour::Param(name))
        .map(|(_, value)| (value.parse().unwrap_or(f64::MAX), value.clone()))
        .collect();
    (case, params)
}

/// Items in first-seen order.
fn distinct<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

/// The panels of one suite's chart, with a peer's figures where it has them.
pub fn panels<'a>(suite: &str, rows: &'a [Row], peer: Option<&Peer>) -> Vec<Panel<'a>> {
    let rows: Vec<&Row> = rows.iter().filter(|row| row.suite == suite && charted(row)).collect();
    let mut panels = Vec::new();
    for (metric, variant, mode) in distinct(rows.iter().map(|row| (row.metric.as_str(), row.variant, row.mode))) {
        let group: Vec<&Row> = rows
            .iter()
            .copied()
            .filter(|row| row.metric == metric && row.variant == variant && row.mode == mode)
            .collect();
        let colour = colour_of(&group);
        let cpus: Vec<CpuVariant> =
            CpuVariant::ALL.into_iter().filter(|cpu| group.iter().any(|row| row.cpu == *cpu)).collect();
        // The CPU variants' figures side by side when they are the colour; one panel for all
        // when their icount figures agree (as the tables merge them); else a panel each.
        let agree = cpus.len() > 1
            && group.iter().all(|row| {
                group.iter().filter(|other| other.label() == row.label()).all(|other| other.median == row.median)
            });
        let by_cpu: Vec<(String, Vec<&Row>)> = if colour == Colour::Cpu || cpus.len() == 1 {
            let cpu_text = if cpus.len() == 1 { format!(", `{}`", cpus[0].name()) } else { String::new() };
            vec![(cpu_text, group.clone())]
        } else if mode == Mode::Icount && agree {
            let first: Vec<&Row> = group.iter().copied().filter(|row| row.cpu == cpus[0]).collect();
            vec![(format!(" (all {} CPU variants)", cpus.len()), first)]
        } else {
            cpus.iter()
                .map(|cpu| {
                    (format!(", `{}`", cpu.name()), group.iter().copied().filter(|row| row.cpu == *cpu).collect())
                })
                .collect()
        };
        let unit = group[0].unit.as_str();
        for (cpu_text, in_panel) in by_cpu {
            let series = distinct(in_panel.iter().map(|row| colour.value(row)));
            let peer_of = |row: &Row| peer.and_then(|peer| (peer.value)(row));
            let magnitudes: Vec<f64> = in_panel
                .iter()
                .map(|row| row.max.abs().max(row.median.abs()).max(peer_of(row).unwrap_or(0.0)))
                .collect();
            let groups = if splits(unit) { magnitude_groups(&magnitudes) } else { vec![0; magnitudes.len()] };
            let parts = groups.iter().max().map_or(1, |last| last + 1);
            for part in 0..parts {
                let members: Vec<&Row> =
                    in_panel.iter().zip(&groups).filter(|(_, group)| **group == part).map(|(row, _)| *row).collect();
                let cases = distinct(members.iter().map(|row| row.case.as_str()));
                let mut slots = distinct(members.iter().map(|row| (colour.slot(row), slot_order(colour, &cases, row))));
                slots.sort_by(|(_, a), (_, b)| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
                let slots: Vec<String> = slots.into_iter().map(|(slot, _)| slot).collect();
                let mut bars: Vec<Bar> = members
                    .iter()
                    .map(|row| Bar {
                        row,
                        slot: slots.iter().position(|slot| *slot == colour.slot(row)).unwrap_or(0),
                        series: series.iter().position(|value| *value == colour.value(row)).unwrap_or(0),
                        peer: peer_of(row),
                    })
                    .collect();
                bars.sort_by_key(|bar| (bar.slot, bar.series));
                let part_text = if parts > 1 {
                    let high = members.iter().map(|row| row.max.abs()).fold(0.0, f64::max);
                    format!(" [{} of {parts}: up to {}]", part + 1, si(high))
                } else {
                    String::new()
                };
                panels.push(Panel {
                    title: format!(
                        "{suite}: {metric}, variant {}, {}{cpu_text}{part_text}",
                        variant.name(),
                        mode.name()
                    ),
                    axis: axis_title(mode, unit),
                    colour,
                    series: series.clone(),
                    slots,
                    bars,
                });
            }
        }
    }
    panels
}

fn color(panel: &Panel, series: usize) -> RGBColor {
    if panel.colour == Colour::Cpu {
        // A CPU variant keeps its colour from panel to panel and chart to chart.
        let cpu = panel.series.get(series).and_then(|name| CpuVariant::ALL.iter().position(|cpu| cpu.name() == name));
        return COLORS[cpu.unwrap_or(series) % COLORS.len()];
    }
    COLORS[series % COLORS.len()]
}

/// Writes the suite's chart.
pub fn draw(path: &Path, suite: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    draw_with(path, suite, rows, None)
}

/// `draw` with a peer's figures marked on the bars they concern.
pub fn draw_with(
    path: &Path,
    suite: &str,
    rows: &[Row],
    peer: Option<&Peer>,
) -> Result<(), Box<dyn std::error::Error>> {
    let panels = panels(suite, rows, peer);
    let height = panels.iter().map(Panel::height).sum::<u32>().max(HEADER);
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    if panels.is_empty() {
        let style = TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(format!("{suite}: no charted rows"), (10, 20), style))?;
    }
    let mut rest = root.clone();
    for panel in &panels {
        let (area, below) = rest.split_vertically(panel.height());
        rest = below;
        draw_panel(&root, &area, panel, peer)?;
    }
    root.present()?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
    peer: Option<&Peer>,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let (header, plot) = area.split_vertically(HEADER);
    let left = TextStyle::from(("sans-serif", 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    header.draw(&Text::new(panel.title.clone(), (10, 13), left))?;
    // The legend: what the colours say, the value of each, and the peer's mark.
    let legend = TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let what = match panel.colour {
        Colour::Param(key) => key,
        colour => colour.name(),
    };
    header.draw(&Text::new(format!("{what}:"), (10, 35), legend.clone()))?;
    let mut x = 20 + 7 * what.len() as i32;
    let present = |series: usize| panel.bars.iter().any(|bar| bar.series == series);
    for (index, name) in panel.series.iter().enumerate().filter(|(index, _)| present(*index)) {
        header.draw(&Rectangle::new([(x, 29), (x + 12, 41)], color(panel, index).filled()))?;
        header.draw(&Text::new(name.clone(), (x + 16, 35), legend.clone()))?;
        x += 28 + 7 * name.len() as i32;
    }
    if let Some(peer) = peer.filter(|_| panel.bars.iter().any(|bar| bar.peer.is_some())) {
        header.draw(&PathElement::new(vec![(x + 6, 28), (x + 6, 42)], BLACK.stroke_width(3)))?;
        header.draw(&Text::new(peer.name.clone(), (x + 14, 35), legend))?;
    }

    let low = panel.bars.iter().map(|bar| bar.row.min.min(bar.peer.unwrap_or(0.0))).fold(0.0_f64, f64::min);
    let high = panel.bars.iter().map(|bar| bar.row.max.max(bar.peer.unwrap_or(0.0))).fold(0.0_f64, f64::max);
    let span = if high > low { high - low } else { 1.0 };
    let slots = panel.slots.len().max(1) as f64;
    // Room on the right for the longest bar's label.
    let mut chart = ChartBuilder::on(&plot)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(LABEL_WIDTH)
        .build_cartesian_2d(low..high + span * 0.15, 0.0..slots)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_label_formatter(&|value| si(*value))
        .x_label_style(("sans-serif", 11))
        .x_desc(panel.axis.as_str())
        .draw()?;
    // Slot names beside their bars, drawn on the whole image at the chart's pixel positions:
    // plotters' numeric axis would place labels at round numbers, not at the slots.
    let style = TextStyle::from(("sans-serif", 11).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (index, label) in panel.slots.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(low, slots - index as f64 - 0.5));
        root.draw(&Text::new(label.clone(), (x - 6, y), style.clone()))?;
    }
    let per_bar = 0.85 / panel.per_slot() as f64;
    // Each bar's place in its slot: its rank among the slot's bars (sorted by colour).
    let place = |index: usize| {
        let bar = &panel.bars[index];
        let rank = panel.bars[..index].iter().filter(|other| other.slot == bar.slot).count() as f64;
        let top = slots - bar.slot as f64 - 0.075 - rank * per_bar;
        (top - per_bar * 0.85, top)
    };
    let value_style = TextStyle::from(("sans-serif", 10).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (index, bar) in panel.bars.iter().enumerate() {
        let (bottom, top) = place(index);
        let middle = (bottom + top) / 2.0;
        let row = bar.row;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.0_f64.max(low), bottom), (row.median, top)],
            color(panel, bar.series).filled(),
        )))?;
        if row.min < row.max {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(row.min, middle), (row.max, middle)],
                BLACK.stroke_width(1),
            )))?;
        }
        if let Some(value) = bar.peer {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(value, bottom), (value, top)],
                BLACK.stroke_width(3),
            )))?;
        }
        let end = row.median.max(row.max).max(bar.peer.unwrap_or(f64::MIN));
        let (x, y) = chart.backend_coord(&(end, middle));
        root.draw(&Text::new(value_label(row), (x + 4, y), value_style.clone()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::tests::rows;

    fn svg_of(suite: &str, rows: &[Row], peer: Option<&Peer>) -> String {
        let path = std::env::temp_dir().join(format!("tracelab-chart-{suite}-{}.svg", std::process::id()));
        draw_with(&path, suite, rows, peer).expect("draws");
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        svg
    }

    /// The words of an SVG's `<text>` elements (plotters writes each on a line of its own).
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|element| Some(element.split_once('>')?.1.split_once("</text>")?.0.trim().to_string()))
            .collect()
    }

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
        let panels = panels("probes", &all, None);
        // The icount hits_per_s row is not charted: three panels, each of one unit.
        let axes: Vec<&str> = panels.iter().map(|panel| panel.axis.as_str()).collect();
        assert_eq!(axes, ["instructions (QEMU icount)", "instructions (QEMU icount)", "virtual ns (TCG emulation)"]);
        assert!(panels.iter().all(|panel| panel.rows().iter().all(|row| row.unit == panel.rows()[0].unit)));
        let svg = svg_of("probes", &all, None);
        assert!(svg.contains("kprobe-nop") && svg.contains("per_hit, variant prod, wall"));
    }

    #[test]
    fn si_ticks_are_short() {
        assert_eq!(si(12_000_000.0), "12M");
        assert_eq!(si(1_500.0), "1.5k");
        assert_eq!(si(2_890_163.387), "2.89M");
        assert_eq!(si(250.0), "250");
        assert_eq!(si(0.5), "0.5");
        assert_eq!(si(0.0), "0");
        assert_eq!(si(3_000_000_000.0), "3G");
        assert_eq!(si(-20_000.0), "-20k");
    }

    #[test]
    fn values_more_than_20x_apart_go_to_panels_of_their_own() {
        assert_eq!(magnitude_groups(&[2.0, 10.0, 1323.0, 0.0, 13.0]), [0, 0, 1, 0, 0]);
        // 41 is over 20x 2: cut at the widest step (2 -> 10), not at the first value past 40.
        assert_eq!(magnitude_groups(&[2.0, 10.0, 1323.0, 40.0, 41.0]), [0, 1, 2, 1, 1]);
        // Exactly 20x stays together.
        assert_eq!(magnitude_groups(&[5.0, 100.0, 101.0, 2000.0]), [0, 1, 1, 1]);
        assert_eq!(magnitude_groups(&[0.0, 0.0]), [0, 0]);
        let all = rows(
            &[
                "ftrace list relevant=1,irrelevant=100 overhead ns 1323",
                "ftrace call-ops relevant=1,irrelevant=100 overhead ns 2",
                "ftrace list relevant=1,irrelevant=0 overhead ns 13",
                "ftrace call-ops relevant=1,irrelevant=0 overhead ns 10",
            ],
            Mode::Wall,
        );
        let panels = panels("ftrace", &all, None);
        assert_eq!(panels.len(), 2, "{:?}", panels.iter().map(|panel| &panel.title).collect::<Vec<_>>());
        assert!(panels[0].title.ends_with("[1 of 2: up to 13]"), "{}", panels[0].title);
        assert_eq!(panels[0].rows().iter().map(|row| row.median).collect::<Vec<_>>(), [13.0, 10.0, 2.0]);
        assert_eq!(panels[1].rows().iter().map(|row| row.median).collect::<Vec<_>>(), [1323.0]);
        // The scheme is the colour; the tracer counts name the slots.
        assert_eq!(panels[0].colour, Colour::Case);
        assert_eq!(panels[0].series, ["list", "call-ops"]);
        // Slots by their params' values, numbers as numbers.
        assert_eq!(panels[0].slots, ["relevant=1,irrelevant=0", "relevant=1,irrelevant=100"]);
        assert_eq!(panels[0].axis, "virtual ns (TCG emulation)");
        // Counts of differently sized workloads stay in one panel: their ratio is the point.
        let counts = rows(
            &["depot saturation distinct=1 records records 1", "depot saturation distinct=65536 records records 65536"],
            Mode::Icount,
        );
        assert_eq!(super::panels("depot", &counts, None).len(), 1);
    }

    #[test]
    fn the_probe_method_is_the_colour_with_a_legend_and_labels() {
        let mut all = rows(
            &[
                "probes kprobe-nop method=single-step per_hit insn 346",
                "probes kprobe-nop method=simulate per_hit insn 240",
                "probes kprobe-push method=single-step per_hit insn 347",
                "probes kprobe-push method=simulate per_hit insn 192",
                "probes kprobe-nop method=simulate hits_per_s hits_per_s 4166645.833",
                "probes kernel-call-nop - per_call insn 3",
            ],
            Mode::Icount,
        );
        all.extend(rows(&["probes kprobe-nop method=simulate hits_per_s hits_per_s 12000000"], Mode::Wall));
        let panels = panels("probes", &all, None);
        let titles: Vec<&str> = panels.iter().map(|panel| panel.title.as_str()).collect();
        // hits_per_s is charted in wall mode only.
        assert_eq!(
            titles,
            [
                "probes: per_hit, variant prod, icount, `max,pauth=off`",
                "probes: per_call, variant prod, icount, `max,pauth=off`",
                "probes: hits_per_s, variant prod, wall, `max,pauth=off`",
            ]
        );
        assert_eq!(panels[0].colour, Colour::Param("method"));
        assert_eq!(panels[0].series, ["single-step", "simulate"]);
        assert_eq!(panels[0].slots, ["kprobe-nop", "kprobe-push"]);
        assert_eq!(panels[0].axis, "instructions (QEMU icount)");
        assert_eq!(panels[2].axis, "hits per virtual second (TCG emulation)");
        let texts = texts(&svg_of("probes", &all, None));
        for text in ["method:", "single-step", "simulate", "346", "192", "12M", "instructions (QEMU icount)"] {
            assert!(texts.iter().any(|known| known == text), "{text} missing from the chart: {texts:?}");
        }
        assert!(!texts.iter().any(|text| text == "4.17M"), "an icount hits_per_s row was charted");
    }

    #[test]
    fn cpu_variants_are_the_colour_only_when_nothing_else_varies() {
        let mut all = Vec::new();
        for (cpu, value) in [(CpuVariant::MaxNoPauth, 632.0), (CpuVariant::MaxQarma5, 5049.0)] {
            let sample = crate::bench::results::Sample::parse(
                &format!("stacktrace fp depth=4 per_trace ns {value}"),
                cpu,
                crate::build::BuildVariant::Prod,
                Mode::Wall,
            )
            .expect("valid row");
            all.extend(Row::aggregate(&[sample]));
        }
        let panels = panels("stacktrace", &all, None);
        assert_eq!(panels.len(), 1);
        assert_eq!(panels[0].colour, Colour::Cpu);
        assert_eq!(panels[0].series, ["max,pauth=off", "max,pauth-qarma5=on"]);
        let texts = texts(&svg_of("stacktrace", &all, None));
        // One rep each: three significant digits.
        for text in ["CPU variant:", "5050", "632", "fp depth=4", "max,pauth-qarma5=on"] {
            assert!(texts.iter().any(|known| known == text), "{text} missing from the chart: {texts:?}");
        }
    }

    #[test]
    fn a_peer_is_marked_and_named_in_the_legend() {
        let all = rows(&["ftrace call-ops relevant=1,irrelevant=0 overhead ns 10"], Mode::Wall);
        let peer = Peer {
            name: "Linux function tracer".into(),
            value: Box::new(|row: &Row| (row.case == "call-ops").then_some(30.0)),
        };
        let panels = panels("ftrace", &all, Some(&peer));
        assert_eq!(panels[0].bars[0].peer, Some(30.0));
        assert!(svg_of("ftrace", &all, Some(&peer)).contains("Linux function tracer"));
        assert!(!svg_of("ftrace", &all, None).contains("Linux function tracer"));
    }
}
