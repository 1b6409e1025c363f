//! A run as a picture (`<json>.svg`, self-contained SVG): the latency distribution of each stage of a turn
//! (p50 to p95 as a bar, a whisker to p99, a tick at the max, on a log scale of milliseconds) and the
//! throughput over time (events published and completed per second).

use std::fmt::Write;

use super::{dist::Dist, report::Report};

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 170.0;
/// The column right of the plots: each row's p50 and p99 in figures.
const RIGHT: f64 = 180.0;
const ROW: f64 = 22.0;

/// The SVG document of `r`.
pub fn svg(r: &Report) -> String {
    let mut rows: Vec<(String, &Dist)> = Vec::new();
    for (name, d) in [
        ("end to end", &r.end_to_end_ms),
        ("worker wall", &r.turn_wall_ms),
        ("overhead", &r.overhead_ms),
        ("model wait", &r.llm_wait_ms),
        ("MongoDB wait", &r.mongo_wait_ms),
    ] {
        if let Some(d) = d.as_ref().filter(|d| d.n > 0) {
            rows.push((name.to_owned(), d));
        }
    }
    rows.extend(
        r.stages
            .iter()
            .filter(|s| s.ms.n > 0)
            .map(|s| (format!("stage {}", s.stage), &s.ms)),
    );
    let latency_h = 60.0 + ROW * rows.len() as f64 + 30.0;
    let throughput_h = 260.0;
    let height = latency_h + throughput_h;
    let mut o = String::new();
    let _ = write!(
        o,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="20" font-size="15" font-weight="bold">companion bench, {}</text>
<text x="10" y="38" fill="#555">{}</text>
"##,
        escape(&r.started_at),
        escape(&r.command)
    );
    latency(&mut o, &rows, 50.0);
    throughput(&mut o, r, latency_h);
    o.push_str("</svg>\n");
    o
}

/// Per-row bars on a log scale from 0.01 ms to the largest max.
fn latency(o: &mut String, rows: &[(String, &Dist)], top: f64) {
    let max = rows
        .iter()
        .map(|(_, d)| d.max)
        .fold(1.0_f64, f64::max)
        .max(1.0);
    let (lo, hi) = (0.01_f64.log10(), max.log10().ceil());
    let x = |ms: f64| LEFT + (ms.max(0.01).log10() - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT);
    let _ = writeln!(
        o,
        r#"<text x="10" y="{}" font-weight="bold">latency per turn, ms (bar p50–p95, whisker to p99, tick at max; log scale)</text>"#,
        top
    );
    let axis_y = top + 12.0 + ROW * rows.len() as f64;
    let mut decade = lo;
    while decade <= hi {
        let v = 10f64.powf(decade);
        let _ = writeln!(
            o,
            r##"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="#ddd"/><text x="{0:.1}" y="{3}" text-anchor="middle" fill="#555">{4}</text>"##,
            x(v),
            top + 8.0,
            axis_y,
            axis_y + 14.0,
            if v < 1.0 {
                format!("{v}")
            } else {
                format!("{v:.0}")
            }
        );
        decade += 1.0;
    }
    for (i, (name, d)) in rows.iter().enumerate() {
        let y = top + 14.0 + ROW * i as f64;
        let mid = y + ROW / 2.0 - 4.0;
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>
<line x1="{:.1}" y1="{mid:.1}" x2="{:.1}" y2="{mid:.1}" stroke="#555"/>
<rect x="{:.1}" y="{:.1}" width="{:.1}" height="12" fill="#4c78a8"/>
<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#c00"/>
<text x="{:.1}" y="{:.1}" fill="#333">p50 {:.2} · p99 {:.2}</text>"##,
            LEFT - 8.0,
            mid + 4.0,
            escape(name),
            x(d.p95),
            x(d.p99),
            x(d.p50),
            mid - 6.0,
            (x(d.p95) - x(d.p50)).max(1.0),
            x(d.max),
            mid - 6.0,
            x(d.max),
            mid + 6.0,
            WIDTH - RIGHT + 12.0,
            mid + 4.0,
            d.p50,
            d.p99
        );
    }
}

/// Published and completed per second, as two lines.
fn throughput(o: &mut String, r: &Report, top: f64) {
    let _ = writeln!(
        o,
        r##"<text x="10" y="{top}" font-weight="bold">events per second: <tspan fill="#999">published</tspan>, <tspan fill="#2a9d3a">completed</tspan></text>"##
    );
    let t = &r.timeline;
    let (x0, y0, w, h) = (LEFT, top + 20.0, WIDTH - LEFT - RIGHT, 190.0);
    let _ = writeln!(
        o,
        r##"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>"##
    );
    if t.is_empty() {
        let _ = writeln!(o, r#"<text x="{x0}" y="{}">no events</text>"#, y0 + 20.0);
        return;
    }
    let peak = t
        .iter()
        .map(|s| s.published.max(s.completed))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    // Headroom above the busiest second, so its line is not drawn on the frame.
    let scale = peak * 1.2;
    let span = (t.len().max(2) - 1) as f64;
    let point = |i: usize, v: usize| (x0 + i as f64 / span * w, y0 + h - v as f64 / scale * h);
    for (color, pick) in [
        (
            "#999",
            (|s: &super::report::Second| s.published) as fn(&_) -> usize,
        ),
        ("#2a9d3a", |s: &super::report::Second| s.completed),
    ] {
        let points: Vec<String> = t
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (px, py) = point(i, pick(s));
                format!("{px:.1},{py:.1}")
            })
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            points.join(" ")
        );
    }
    let _ = writeln!(
        o,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#555">{peak:.0}/s</text>
<text x="{}" y="{}" text-anchor="end" fill="#555">0</text>
<text x="{x0}" y="{}" fill="#555">0 s</text>
<text x="{}" y="{}" text-anchor="end" fill="#555">{} s</text>"##,
        x0 - 6.0,
        y0 + h - peak / scale * h + 4.0,
        x0 - 6.0,
        y0 + h,
        y0 + h + 16.0,
        x0 + w,
        y0 + h + 16.0,
        t.len() - 1
    );
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::{Second, StageDist};

    #[test]
    fn a_report_draws_every_stage_and_the_timeline() {
        let d = Dist::of(&[1.0, 2.0, 3.0, 40.0]);
        let mut r = Report::empty("companion-dev bench --turns 4");
        r.end_to_end_ms = Some(d.clone());
        r.stages = vec![StageDist {
            stage: "order",
            turns: 4,
            ms: d,
        }];
        r.timeline = (0..5)
            .map(|i| Second {
                second: i,
                published: 10,
                completed: i * 2,
            })
            .collect();
        let s = svg(&r);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("stage order") && s.contains("end to end"), "{s}");
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("10/s"), "{s}");
    }
}
