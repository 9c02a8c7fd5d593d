//! `dpuio bench --plot FILE`: a PNG with a panel each for throughput (GiB/s, or
//! operations per second for metadata), host CPU seconds per GiB and, with
//! `--agent-pid`, the agent's CPU seconds per GiB: one bar per path, grouped by workload,
//! so the shim's figures stand next to the POSIX baseline's, and what the agent spent
//! for them beside. The legend says what the baseline reads (the stored bytes) and which
//! rows the agent decrypts (an encrypted tenant's: the same colour, lighter).

use std::path::Path;

use plotters::prelude::*;

use crate::report::note;
use crate::workloads::{DECRYPT, Figures};

/// Fonts looked for, in order (Debian's fonts-dejavu-core ships the first).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn colour(path: &str) -> RGBColor {
    if let Some(plain) = path.strip_suffix(DECRYPT) {
        let RGBColor(r, g, b) = colour(plain);
        let lighter = |c: u8| ((u16::from(c) + 2 * 255) / 3) as u8;
        return RGBColor(lighter(r), lighter(g), lighter(b));
    }
    match path {
        "posix" => RGBColor(120, 120, 120),
        "shim-ucx-sm" => RGBColor(31, 119, 180),
        "shim-ucx-tcp" => RGBColor(255, 127, 14),
        "shim-ofi-shm" => RGBColor(148, 103, 189),
        "shim-ofi-tcp" => RGBColor(214, 39, 40),
        _ => RGBColor(44, 160, 44),
    }
}

/// What a panel shows of one result (None: not applicable, no bar).
type Metric = dyn Fn(&Figures) -> Option<f64>;

pub fn plot(all: &[Figures], out: &Path) -> Result<(), String> {
    let font = FONTS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or_else(|| format!("no font found for the plot (install fonts-dejavu-core; looked in {FONTS:?})"))?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| "the plot font could not be loaded".to_owned())?;

    let mut workloads: Vec<&str> = Vec::new();
    let mut paths: Vec<&str> = Vec::new();
    for f in all {
        if !workloads.contains(&f.workload.as_str()) {
            workloads.push(&f.workload);
        }
        if !paths.contains(&f.path.as_str()) {
            paths.push(&f.path);
        }
    }
    let throughput: &Metric = &|f: &Figures| Some(if f.bytes > 0 { f.gib_per_s() } else { f.iops() / 1000.0 });
    let host_cpu: &Metric = &|f: &Figures| (f.bytes > 0).then(|| f.host_cpu_s_per_gib());
    let agent_cpu: &Metric = &|f: &Figures| f.agent_cpu_s_per_gib().filter(|_| f.bytes > 0);
    let mut panels: Vec<(&str, &Metric)> = vec![
        ("throughput (GiB/s; metadata: kops/s; higher is better)", throughput),
        ("host CPU seconds per GiB: the training job's cores (lower is better)", host_cpu),
    ];
    if all.iter().any(|f| agent_cpu(f).is_some()) {
        panels
            .push(("agent CPU seconds per GiB: what dpuio spent for it (on a BlueField, the DPU's cores)", agent_cpu));
    }
    let root = BitMapBackend::new(out, (1400 + LEGEND_WIDTH, 60 + 450 * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(
            "The same files through POSIX (the stored bytes) and through dpuio's shim; +decrypt: the agent decrypts",
            ("sans-serif", 24),
        )
        .map_err(|e| e.to_string())?;
    // One legend for every panel, beside them, so that it hides no bar.
    let (charts, legend) = root.split_horizontally(1400);
    draw_legend(&legend, &paths)?;
    let areas = charts.split_evenly((panels.len(), 1));
    for ((title, value), area) in panels.into_iter().zip(areas) {
        let max = all.iter().filter_map(value).fold(0.0f64, f64::max).max(1e-6) * 1.15;
        let groups = workloads.len() as f64;
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..groups, 0.0..max)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
        let width = 0.8 / paths.len() as f64;
        for (pi, path) in paths.iter().enumerate() {
            let bars: Vec<(f64, f64)> = workloads
                .iter()
                .enumerate()
                .filter_map(|(wi, w)| {
                    let f = all.iter().find(|f| f.workload == *w && f.path == *path)?;
                    let v = value(f)?;
                    let x0 = wi as f64 + 0.1 + pi as f64 * width;
                    Some((x0, v))
                })
                .collect();
            let rectangles =
                bars.iter().map(|&(x0, v)| Rectangle::new([(x0, 0.0), (x0 + width * 0.9, v)], colour(path).filled()));
            chart.draw_series(rectangles).map_err(|e| e.to_string())?;
            // The figure above its bar: a short bar beside a tall one is still read.
            let values = bars
                .iter()
                .map(|&(x0, v)| Text::new(format!("{v:.3}"), (x0, v + max * 0.01), ("sans-serif", 12).into_font()));
            chart.draw_series(values).map_err(|e| e.to_string())?;
        }
        // Group names above each group (ticks of a float axis would not land on them).
        chart
            .draw_series(
                workloads.iter().enumerate().map(|(i, w)| {
                    Text::new(w.to_string(), (i as f64 + 0.12, max * 0.97), ("sans-serif", 17).into_font())
                }),
            )
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| format!("cannot write {}: {e}", out.display()))
}

/// Pixels to the right of the panels for the legend.
const LEGEND_WIDTH: u32 = 360;

/// A colour box and the path's name per path, with what it reads under it where that
/// is said (the baseline's stored bytes, the rows the agent decrypts).
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    paths: &[&str],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut y = 80;
    for path in paths {
        area.draw(&Rectangle::new([(10, y), (28, y + 18)], colour(path).filled())).map_err(err)?;
        area.draw(&Text::new(path.to_string(), (38, y), ("sans-serif", 17).into_font())).map_err(err)?;
        if let Some(note) = note(path) {
            let style = ("sans-serif", 15).into_font().color(&RGBColor(90, 90, 90));
            area.draw(&Text::new(note, (38, y + 21), style)).map_err(err)?;
            y += 21;
        }
        y += 34;
    }
    Ok(())
}
