//! Draws `make bench`'s pictures: each `*.plot.json` in the run's output directory becomes an
//! SVG beside `BENCHMARKS.md` (`benchmarks/<name>.svg`).
//!
//! `cargo run --release --example bench_plots -- OUT_DIR benchmarks/`
//!
//! A plot file is one of three kinds, written by `scripts/bench_report.py` from the run's
//! outputs: `lines` (panels of series over a shared x axis), `bars` (groups of bars) and
//! `timeline` (events on named lanes).

use std::error::Error;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::Deserialize;

/// One picture.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Plot {
    /// Panels stacked over one x axis.
    Lines {
        title: String,
        x_label: String,
        panels: Vec<Panel>,
    },
    /// Groups of bars, one bar per series in each group.
    Bars {
        title: String,
        y_label: String,
        groups: Vec<String>,
        series: Vec<Bars>,
    },
    /// Events on lanes over time.
    Timeline {
        title: String,
        x_label: String,
        lanes: Vec<String>,
        events: Vec<Event>,
    },
}

#[derive(Deserialize)]
struct Panel {
    y_label: String,
    series: Vec<Series>,
}

#[derive(Deserialize)]
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

#[derive(Deserialize)]
struct Bars {
    name: String,
    values: Vec<f64>,
}

#[derive(Deserialize)]
struct Event {
    lane: usize,
    at: f64,
    label: String,
}

type Drawn = Result<(), Box<dyn Error>>;

const COLOURS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

fn top(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0_f64, f64::max).max(1e-9) * 1.1
}

/// A chart of the lines and bars pictures: numbers on both axes.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The series' names, boxed in the upper right corner.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> Drawn {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn lines(path: &Path, title: &str, x_label: &str, panels: &[Panel]) -> Drawn {
    let root = SVGBackend::new(path, (900, 260 * panels.len() as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let x_max = top(panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| s.points.iter().map(|p| p.0)));
    for (panel, area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
        let y_max = top(panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1)));
        let mut chart = ChartBuilder::on(&area)
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(&panel.y_label)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        for (i, s) in panel.series.iter().enumerate() {
            let c = colour(i);
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))?
                .label(&s.name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

fn bars(path: &Path, title: &str, y_label: &str, groups: &[String], series: &[Bars]) -> Drawn {
    // Room for each group's name above its bars.
    let width = (150 * groups.len() as u32).max(900);
    let root = SVGBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let y_max = top(series.iter().flat_map(|s| s.values.iter().copied())) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(10)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..groups.len() as f64, 0.0..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(y_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let width = 0.8 / series.len().max(1) as f64;
    for (j, s) in series.iter().enumerate() {
        let c = colour(j);
        chart
            .draw_series(s.values.iter().enumerate().map(|(i, v)| {
                let x0 = i as f64 + 0.1 + j as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, *v)], c.filled())
            }))?
            .label(&s.name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], c.filled()));
    }
    chart.draw_series(groups.iter().enumerate().map(|(i, g)| {
        Text::new(
            g.clone(),
            (i as f64 + 0.1, y_max * 0.97),
            ("sans-serif", 15),
        )
    }))?;
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

fn timeline(path: &Path, title: &str, x_label: &str, lanes: &[String], events: &[Event]) -> Drawn {
    let root = SVGBackend::new(path, (1100, 100 + 70 * lanes.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    // Room on the right for the last event's label.
    let x_max = top(events.iter().map(|e| e.at)) * 1.15;
    let n = lanes.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(150)
        .build_cartesian_2d(0.0..x_max, -1..n)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_labels(lanes.len() + 1)
        .y_label_formatter(&|y| {
            usize::try_from(*y)
                .ok()
                .and_then(|i| lanes.get(i).cloned())
                .unwrap_or_default()
        })
        .draw()?;
    // Each event a dot, its label above or below it by turns on its lane, so neighbours do
    // not overlap.
    let mut seen = vec![0_usize; lanes.len()];
    let turns: Vec<usize> = events
        .iter()
        .map(|e| {
            let turn = seen.get(e.lane).copied().unwrap_or_default();
            if let Some(n) = seen.get_mut(e.lane) {
                *n += 1;
            }
            turn
        })
        .collect();
    chart.draw_series(events.iter().zip(turns).map(|(e, turn)| {
        let dy = if turn % 2 == 0 { -18 } else { 8 };
        EmptyElement::at((e.at, e.lane as i32))
            + Circle::new((0, 0), 5, colour(e.lane).filled())
            + Text::new(e.label.clone(), (6, dy), ("sans-serif", 12))
    }))?;
    root.present()?;
    Ok(())
}

fn main() -> Drawn {
    let args: Vec<String> = std::env::args().collect();
    let (Some(from), Some(to)) = (args.get(1), args.get(2)) else {
        return Err("usage: bench_plots OUT_DIR PICTURES_DIR".into());
    };
    std::fs::create_dir_all(to)?;
    let mut names: Vec<_> = std::fs::read_dir(from)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".plot.json"))
        .collect();
    names.sort();
    for spec in names {
        let plot: Plot = serde_json::from_slice(&std::fs::read(&spec)?)?;
        let stem = spec
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".plot.json"))
            .ok_or("a plot file's name")?;
        let path = Path::new(to).join(format!("{stem}.svg"));
        match &plot {
            Plot::Lines {
                title,
                x_label,
                panels,
            } => lines(&path, title, x_label, panels)?,
            Plot::Bars {
                title,
                y_label,
                groups,
                series,
            } => bars(&path, title, y_label, groups, series)?,
            Plot::Timeline {
                title,
                x_label,
                lanes,
                events,
            } => timeline(&path, title, x_label, lanes, events)?,
        }
        println!("wrote {}", path.display());
    }
    Ok(())
}
