//! Shared output for benchmarks and simulations: summary statistics, aligned tables, JSON,
//! line plots and progress bars. Every `bench` and `sim` command reports through here so they
//! all look and behave alike.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

/// Min / median / max of repeated measurements (e.g. ns per round trip, one per repetition).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// The smallest sample.
    pub min: f64,
    /// The middle sample (the mean of the two middle ones for an even count).
    pub median: f64,
    /// The largest sample.
    pub max: f64,
    /// How many samples.
    pub samples: usize,
}

impl Stats {
    /// Summarises `samples`; `None` when there are none (or any is NaN).
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() || samples.iter().any(|s| s.is_nan()) {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Stats { min: v[0], median, max: v[n - 1], samples: n })
    }
}

/// The median over repetitions of `runs[i] / base[i]`, each run over the baseline's run of the
/// same repetition (repetitions whose baseline is 0 are left out); `None` without any. Paired
/// so, a drift of the host between repetitions cancels out.
pub fn paired_median(runs: &[f64], base: &[f64]) -> Option<f64> {
    Stats::of(&paired_ratios(runs, base)).map(|s| s.median)
}

/// How sure a [`paired_interval`] is: the interval and the chance that it holds the true
/// median of the paired ratios.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    /// The lower end.
    pub low: f64,
    /// The upper end.
    pub high: f64,
    /// The chance it covers the median (0.95 or a little more; less with under 6 pairs).
    pub coverage: f64,
}

impl Interval {
    /// Its ends, "0.95–1.03" at `digits` decimals.
    pub fn range(&self, digits: usize) -> String {
        format!("{:.digits$}–{:.digits$}", self.low, self.high)
    }

    /// How sure it is, "with 96.9 % chance".
    pub fn chance(&self) -> String {
        format!("with {:.1} % chance", 100.0 * self.coverage)
    }
}

/// The ratios `runs[i] / base[i]` of the repetitions whose baseline is not 0.
fn paired_ratios(runs: &[f64], base: &[f64]) -> Vec<f64> {
    runs.iter().zip(base).filter(|(_, &b)| b > 0.0).map(|(&r, &b)| r / b).collect()
}

/// An interval for the median of `runs[i] / base[i]` (see [`paired_median`]) that needs no
/// assumption about their distribution: the order statistics that a sign test puts around the
/// median, the narrowest pair whose coverage is at least 95 %. The ratios of independent
/// repetitions are each above the true median with chance one half, so the count above it is
/// binomial. With under 6 pairs no pair of order statistics reaches 95 %: the interval is then
/// the range of the ratios, with its own coverage, 1 − 2^(1−n). `None` with under 2 pairs.
pub fn paired_interval(runs: &[f64], base: &[f64]) -> Option<Interval> {
    let mut ratios = paired_ratios(runs, base);
    ratios.retain(|r| !r.is_nan());
    let n = ratios.len();
    if n < 2 {
        return None;
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    // P(B <= j) for B ~ Binomial(n, 1/2), j = 0, 1, ...: the chance that j or fewer ratios
    // fall below the median. Order statistic k (1-based) and n + 1 - k cover the median with
    // chance 1 - 2 P(B <= k - 1).
    // In logarithms: 2^-n underflows past a thousand pairs, while the terms that matter do not.
    let mut ln_term = -(n as f64) * std::f64::consts::LN_2; // ln P(B = 0)
    let mut below = ln_term.exp();
    let mut k = 1;
    loop {
        // Would order statistic k + 1 still cover with 95 %?
        ln_term += ((n - k + 1) as f64 / k as f64).ln(); // ln P(B = k)
        let term = ln_term.exp();
        if k + 1 > n / 2 || 1.0 - 2.0 * (below + term) < 0.95 {
            break;
        }
        below += term;
        k += 1;
    }
    Some(Interval { low: ratios[k - 1], high: ratios[n - k], coverage: 1.0 - 2.0 * below })
}

/// The `p`-th percentile (0..=100) of `samples` by nearest rank; `None` when empty.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// Column alignment.
#[derive(Clone, Copy)]
pub enum Align {
    /// Text: names, labels.
    Left,
    /// Numbers.
    Right,
}

/// A plain-text table with a header row, aligned columns and an optional title and footnotes.
pub struct Table {
    title: Option<String>,
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    /// A table whose first column is left-aligned and the rest right-aligned (names, then numbers).
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Table {
        let header: Vec<String> = header.into_iter().map(Into::into).collect();
        let align = (0..header.len()).map(|i| if i == 0 { Align::Left } else { Align::Right }).collect();
        Table { title: None, header, align, rows: Vec::new(), notes: Vec::new() }
    }

    /// A line printed above the table.
    pub fn title(mut self, title: impl Into<String>) -> Table {
        self.title = Some(title.into());
        self
    }

    /// Sets one column's alignment (the first is left-aligned, the others right).
    pub fn align(mut self, column: usize, align: Align) -> Table {
        self.align[column] = align;
        self
    }

    /// Adds a row; missing cells are left empty, extra ones dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// A line printed under the table (units, what the baseline is, caveats).
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// The table as text: title, header, a rule, the rows, the notes.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([self.header[c].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&widths)
                .zip(&self.align)
                .map(|((cell, &w), align)| match align {
                    Align::Left => format!("{cell:<w$}"),
                    Align::Right => format!("{cell:>w$}"),
                })
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        let mut out = String::new();
        if let Some(title) = &self.title {
            out.push_str(title);
            out.push('\n');
        }
        out.push_str(&line(&self.header));
        out.push('\n');
        let total: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        for note in &self.notes {
            out.push_str(note);
            out.push('\n');
        }
        out
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// Formats a duration in nanoseconds with a sensible unit ("85 ns", "1.42 µs", "3.1 ms").
pub fn fmt_ns(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Formats a rate ("2.41 M/s", "830 k/s").
pub fn fmt_rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.2} M/s", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1} k/s", per_s / 1e3)
    } else {
        format!("{per_s:.1} /s")
    }
}

/// The output flags every `corehop bench` takes, flattened into its `Args`. What `--quick`
/// shortens, the `--json` shape and what `--plot` draws differ per bench: each says so in its
/// own long help.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OutputArgs {
    /// A short run (a few seconds) for smoke tests and the tour.
    ///
    /// The description above says what it shortens.
    #[arg(long)]
    pub quick: bool,
    /// Print JSON instead of the table.
    ///
    /// Its stable shape is in the description above.
    #[arg(long)]
    pub json: bool,
    /// Also draw the results into this SVG file.
    ///
    /// The description above says what it draws.
    #[arg(long, value_name = "FILE.svg", value_parser = plot_path)]
    pub plot: Option<PathBuf>,
}

/// Checks a `--plot` path when the command line is read, not after a run of minutes: the file
/// must be named `.svg` (what is drawn is SVG) in a folder that exists.
pub fn plot_path(text: &str) -> Result<PathBuf, String> {
    if !Path::new(text).extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) {
        return Err("plots are drawn as SVG: name the file .svg".into());
    }
    output_path(text)
}

/// Checks a path that a command writes its results to, when the command line is read: its
/// folder must exist, so that a run is not lost for want of it.
pub fn output_path(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => Err(format!("there is no folder {}", dir.display())),
        _ => Ok(path),
    }
}

/// Writes `value` as pretty JSON to stdout.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// One named curve of (x, y) points for [`plot_lines`].
pub struct Series {
    /// The legend entry.
    pub name: String,
    /// The points, in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// Axis scale for [`plot_lines`].
#[derive(Clone, Copy, PartialEq)]
pub enum Scale {
    /// Evenly spaced values.
    Linear,
    /// Evenly spaced powers of ten (sizes, rates spanning decades).
    Log10,
}

/// Draws `series` as lines with markers into an SVG file.
pub fn plot_lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    x_scale: Scale,
    series: &[Series],
) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let pts = || series.iter().flat_map(|s| s.points.iter().copied());
    let (mut x0, mut x1) = pts().fold((f64::MAX, f64::MIN), |(a, b), (x, _)| (a.min(x), b.max(x)));
    let y1 = pts().fold(0.0f64, |m, (_, y)| m.max(y)) * 1.1;
    anyhow::ensure!(x0.is_finite() && x1.is_finite(), "nothing to plot");
    if x0 == x1 {
        x0 -= 1.0;
        x1 += 1.0;
    }
    let tx = |x: f64| if x_scale == Scale::Log10 { x.max(f64::MIN_POSITIVE).log10() } else { x };

    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(tx(x0)..tx(x1), 0.0..y1.max(1e-9))?;
    let x_fmt =
        |v: &f64| if x_scale == Scale::Log10 { format!("{:.3}", 10f64.powf(*v)) } else { format!("{v:.3}") };
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).x_label_formatter(&x_fmt).draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (tx(x), y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Draws labelled bars (e.g. median ns per mechanism) into an SVG file.
pub fn plot_bars(path: &Path, title: &str, y_label: &str, bars: &[(String, f64)]) -> anyhow::Result<()> {
    use plotters::prelude::*;

    anyhow::ensure!(!bars.is_empty(), "nothing to plot");
    let y1 = bars.iter().fold(0.0f64, |m, (_, y)| m.max(*y)) * 1.15;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d((0..n).into_segmented(), 0.0..y1.max(1e-9))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_label)
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => bars.get(*i).map(|b| b.0.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, y))| {
        let color = Palette99::pick(i).to_rgba();
        Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), *y)], color.filled())
    }))?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A progress bar on stderr for long runs; hidden when stderr is not a terminal or in CI.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let hidden = std::env::var_os("CI").is_some();
    let bar = if hidden { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(len) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg} ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

/// What the rest of the machine did while a benchmark ran: the CPU time that processes other
/// than this one (and the children it waited for) used, and the time the hypervisor ran
/// something else on the CPUs (steal). Either skews every figure of a run, and neither shows in
/// its own timings: an earlier run of one of these benchmarks, left behind, once kept both CPUs
/// of the development VM busy for 40 minutes, and every figure taken meanwhile read moving at
/// 0.6-0.9 of not moving (docs/performance.md, "Forty-seventh session").
pub struct OutsideLoad {
    start: Option<Ticks>,
    at: std::time::Instant,
}

/// CPU time from `/proc/stat` (all CPUs) and `/proc/self/stat`, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ticks {
    /// Every CPU's time, busy or not.
    total: u64,
    /// Busy: user, nice, system, irq and softirq.
    busy: u64,
    steal: u64,
    /// This process's user and system time and that of the children it waited for.
    own: u64,
}

/// The shortest run [`OutsideLoad::finish`] judges: clock ticks are 10 ms here.
const OUTSIDE_MIN_RUN: std::time::Duration = std::time::Duration::from_secs(2);
/// The share of the CPUs' time, taken by others or by the hypervisor, that is worth a warning.
const OUTSIDE_WARN: f64 = 0.1;

impl OutsideLoad {
    /// Runs `measure` and then, if it lasted 2 s or more and other processes kept the CPUs
    /// busy, or the hypervisor took them, for a tenth of their time or more, says so on stderr.
    pub fn warn_around<T>(measure: impl FnOnce() -> T) -> T {
        let outside = OutsideLoad::start();
        let result = measure();
        if let Some(warning) = outside.finish() {
            eprintln!("{warning}");
        }
        result
    }

    /// Starts watching (nothing is watched where `/proc` cannot be read).
    fn start() -> OutsideLoad {
        OutsideLoad { start: Ticks::now(), at: std::time::Instant::now() }
    }

    /// A warning for stderr if, since [`OutsideLoad::start`], others kept the CPUs busy or the
    /// hypervisor took them for at least a tenth of their time, in a run of at least 2 s.
    fn finish(self) -> Option<String> {
        if self.at.elapsed() < OUTSIDE_MIN_RUN {
            return None;
        }
        outside_warning(self.start?, Ticks::now()?)
    }
}

impl Ticks {
    fn now() -> Option<Ticks> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        Ticks::parse(&stat, &own)
    }

    /// From the texts of `/proc/stat` and `/proc/self/stat`.
    fn parse(stat: &str, own: &str) -> Option<Ticks> {
        let fields: Vec<u64> = stat
            .lines()
            .find_map(|line| line.strip_prefix("cpu "))?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice, inside user and nice]
        let field = |i: usize| fields.get(i).copied().unwrap_or(0);
        let total = (0..8).map(field).sum();
        let busy = field(0) + field(1) + field(2) + field(5) + field(6);
        // The command name, field 2, is in parentheses and may hold spaces: count from after it.
        let rest: Vec<&str> = own.get(own.rfind(')')? + 1..)?.split_whitespace().collect();
        // utime, stime, cutime, cstime: fields 14-17, so 11-14 after the name and the state.
        let own_ticks = (11..15).map(|i| rest.get(i)?.parse::<u64>().ok()).sum::<Option<u64>>()?;
        Some(Ticks { total, busy, steal: field(7), own: own_ticks })
    }
}

/// The warning [`OutsideLoad::finish`] gives between two readings, if any.
fn outside_warning(start: Ticks, end: Ticks) -> Option<String> {
    let total = end.total.checked_sub(start.total).filter(|&t| t > 0)? as f64;
    let others = end.busy.saturating_sub(start.busy).saturating_sub(end.own.saturating_sub(start.own));
    let (others, steal) = (others as f64 / total, end.steal.saturating_sub(start.steal) as f64 / total);
    (others >= OUTSIDE_WARN || steal >= OUTSIDE_WARN).then(|| {
        format!(
            "warning: while this ran, other processes kept the CPUs busy {:.0} % of the time and the \
             hypervisor took {:.0} % of it for others (steal): every figure above was measured beside \
             them, not on this machine alone (`top` shows who)",
            others * 100.0,
            steal * 100.0
        )
    })
}

/// Which of `n` contenders runs `k`-th (`k < n`) in repetition `rep`: the first moves on by
/// one each repetition, and every other repetition runs backwards. What a run leaves behind (a
/// service thread still polling, sockets, a host that just moved the vCPUs) then falls on each
/// contender from a different one in turn. Turned only, each would follow the same one every
/// time but when it ran first.
pub fn turn(rep: usize, k: usize, n: usize) -> usize {
    let first = rep % n;
    if rep.is_multiple_of(2) {
        (first + k) % n
    } else {
        (first + n - k) % n
    }
}

/// Runs `a` and `b` `pairs` times each, back to back, `a` first in even pairs and `b` first in
/// odd ones, so that the host's slow and fast moments fall on both; returns their results in
/// pair order. `done` is called after every run (a progress bar's tick).
pub fn back_to_back<T>(
    pairs: usize,
    mut a: impl FnMut() -> anyhow::Result<T>,
    mut b: impl FnMut() -> anyhow::Result<T>,
    mut done: impl FnMut(),
) -> anyhow::Result<(Vec<T>, Vec<T>)> {
    let (mut runs_a, mut runs_b) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
    for pair in 0..pairs {
        for a_now in [pair % 2 == 0, pair % 2 == 1] {
            if a_now {
                runs_a.push(a()?);
            } else {
                runs_b.push(b()?);
            }
            done();
        }
    }
    Ok((runs_a, runs_b))
}

/// Repetitions a benchmark takes at most: each one's figures are kept until the end.
pub const MAX_REPS: usize = 10_000;
/// Milliseconds one measured run may last at most (ten minutes).
pub const MAX_RUN_MS: u64 = 600_000;

/// `items` in their order, each value once: a value named twice in a list flag runs once.
pub fn each_once<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut once = Vec::new();
    for item in items {
        if !once.contains(&item) {
            once.push(item);
        }
    }
    once
}

/// Checks that `value`, given as `flag`, lies in `range`: every count that sizes a
/// buffer or a run is bounded, with an error that names the flag and the bounds.
pub fn check_range<T>(flag: &str, value: T, range: std::ops::RangeInclusive<T>) -> anyhow::Result<()>
where
    T: PartialOrd + std::fmt::Display,
{
    anyhow::ensure!(
        range.contains(&value),
        "{flag} must be between {} and {}, got {value}",
        range.start(),
        range.end()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_load_counts_what_others_and_the_hypervisor_took() {
        let stat = |user: u64, idle: u64, steal: u64| {
            format!("cpu  {user} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2\n")
        };
        // `comm` may hold spaces and parentheses; utime, stime, cutime, cstime are 14-17.
        let own = |ticks: u64| format!("42 (a (b) c) S 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0");
        let t0 = Ticks::parse(&stat(100, 1000, 0), &own(50)).unwrap();
        assert_eq!(t0, Ticks { total: 1100, busy: 100, steal: 0, own: 50 });
        // 1000 ticks pass: this process used 300 of them, everything busy 350 of them.
        let quiet = Ticks::parse(&stat(450, 1650, 0), &own(350)).unwrap();
        assert_eq!(outside_warning(t0, quiet), None, "others 5 %");
        let loaded = Ticks::parse(&stat(700, 1400, 0), &own(350)).unwrap();
        let warning = outside_warning(t0, loaded).expect("others 30 %");
        assert!(warning.contains("busy 30 %") && warning.contains("took 0 %"), "{warning}");
        let stolen = Ticks::parse(&stat(400, 1500, 200), &own(350)).unwrap();
        assert!(outside_warning(t0, stolen).expect("steal 20 %").contains("took 20 %"));
        assert_eq!(Ticks::parse("intr 1\n", &own(1)), None, "no cpu line");
        assert_eq!(Ticks::parse(&stat(1, 1, 0), "42 (x) S 1"), None, "a cut line");
    }

    #[test]
    fn outside_load_reads_this_machine() {
        let t = Ticks::now().expect("/proc is there");
        assert!(t.total >= t.busy + t.steal && t.total > 0, "{t:?}");
    }

    #[test]
    fn turns_run_each_contender_once_and_vary_who_runs_before_it() {
        for n in 1..=7 {
            let mut before: Vec<std::collections::BTreeSet<usize>> = vec![Default::default(); n];
            for rep in 0..2 * n {
                let order: Vec<usize> = (0..n).map(|k| turn(rep, k, n)).collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "rep {rep} of {n}: {order:?}");
                for pair in order.windows(2) {
                    before[pair[1]].insert(pair[0]);
                }
            }
            for (i, seen) in before.iter().enumerate() {
                assert!(seen.len() >= (n - 1).min(2), "{i} of {n} ran after only {seen:?}");
            }
            let firsts: std::collections::BTreeSet<usize> = (0..n).map(|rep| turn(rep, 0, n)).collect();
            assert_eq!(firsts.len(), n, "each runs first once in {n} repetitions");
        }
    }

    #[test]
    fn back_to_back_pairs_alternate_who_goes_first() {
        let order = std::cell::RefCell::new(String::new());
        let (a, b) = back_to_back(
            3,
            || {
                order.borrow_mut().push('a');
                Ok(order.borrow().len())
            },
            || {
                order.borrow_mut().push('b');
                Ok(order.borrow().len())
            },
            || order.borrow_mut().push('.'),
        )
        .unwrap();
        assert_eq!(order.into_inner(), "a.b.b.a.a.b.");
        assert_eq!((a, b), (vec![1, 7, 9], vec![3, 5, 11]));
        let failed = back_to_back(2, || Ok(1), || anyhow::bail!("no"), || {});
        assert!(failed.is_err(), "an error ends the pairs");
    }

    #[test]
    fn plot_paths_are_svg_files_in_folders_that_exist() {
        assert_eq!(plot_path("o2.svg").unwrap(), PathBuf::from("o2.svg"));
        assert!(plot_path("/tmp/A.SVG").is_ok());
        assert!(plot_path("o2.png").unwrap_err().contains("name the file .svg"));
        assert!(plot_path("o2").unwrap_err().contains("name the file .svg"));
        assert!(plot_path("/no/such/folder/o2.svg").unwrap_err().contains("no folder /no/such/folder"));
    }

    /// The binomial chance that at most `j` of `n` fair coins land heads, each term from its
    /// own binomial coefficient (in logarithms, as 2^-n underflows for large `n`).
    fn at_most(n: u32, j: u32) -> f64 {
        let ln_choose = |k: u32| (0..k).map(|i| (f64::from(n - i) / f64::from(i + 1)).ln()).sum::<f64>();
        (0..=j).map(|k| (ln_choose(k) - f64::from(n) * std::f64::consts::LN_2).exp()).sum()
    }

    #[test]
    fn the_paired_interval_is_the_sign_tests_pair_of_order_statistics() {
        let base = vec![1.0; 21];
        // Ratios 1.00, 1.01, ..., 1.20, given out of order.
        let runs: Vec<f64> = (0..21).map(|i| 1.0 + f64::from((i * 8) % 21) / 100.0).collect();
        let i = paired_interval(&runs, &base).unwrap();
        // 21 pairs: the 6th from each end (P(B <= 5) = 0.0133, P(B <= 6) = 0.0392).
        assert!((i.low - 1.05).abs() < 1e-9 && (i.high - 1.15).abs() < 1e-9, "{i:?}");
        assert!((i.coverage - (1.0 - 2.0 * at_most(21, 5))).abs() < 1e-12);
        assert!(i.coverage >= 0.95 && 1.0 - 2.0 * at_most(21, 6) < 0.95, "the narrowest at 95 %");
        let median = paired_median(&runs, &base).unwrap();
        assert!(i.low <= median && median <= i.high);
    }

    #[test]
    fn with_few_pairs_the_interval_is_their_range_and_says_how_sure_it_is() {
        let i = paired_interval(&[1.1, 0.9, 1.3, 1.0, 1.2], &[1.0; 5]).unwrap();
        assert_eq!((i.low, i.high), (0.9, 1.3));
        assert!((i.coverage - (1.0 - 2.0 / 32.0)).abs() < 1e-12, "{i:?}");
        let i = paired_interval(&[2.0, 4.0], &[2.0, 2.0]).unwrap();
        assert_eq!((i.low, i.high, i.coverage), (1.0, 2.0, 0.5));
        assert_eq!(paired_interval(&[1.0], &[1.0]), None, "one pair says nothing of a spread");
        assert_eq!(paired_interval(&[1.0, 2.0], &[0.0, 1.0]), None, "a zero baseline is left out");
    }

    #[test]
    fn at_every_count_the_interval_covers_at_least_95_percent_once_it_can() {
        for n in (2..200u32).chain([1500, 4000]) {
            let runs: Vec<f64> = (0..n).map(f64::from).collect();
            let i = paired_interval(&runs, &vec![1.0; n as usize]).unwrap();
            let k = i.low as u32 + 1; // the 1-based order statistic taken
            assert_eq!(i.high as u32, n - k, "symmetric at n = {n}");
            assert!((i.coverage - (1.0 - 2.0 * at_most(n, k - 1))).abs() < 1e-9, "n = {n}");
            if n >= 6 {
                assert!(i.coverage >= 0.95, "n = {n}: {i:?}");
                assert!(k == n / 2 || 1.0 - 2.0 * at_most(n, k) < 0.95, "n = {n}: not the narrowest");
            } else {
                assert_eq!(k, 1, "n = {n}: the range");
            }
        }
    }

    #[test]
    fn stats_of_odd_and_even_counts() {
        let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.max, s.samples), (1.0, 2.0, 3.0, 3));
        let s = Stats::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Stats::of(&[]).is_none());
        assert!(Stats::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn percentile_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(["name", "ns"]);
        t.row(["floor", "85"]);
        t.row(["handoff+spin", "190"]);
        let out = t.render();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "name           ns");
        assert_eq!(lines[2], "floor          85");
        assert_eq!(lines[3], "handoff+spin  190");
    }

    #[test]
    fn plots_write_svg_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        let s = [Series { name: "a".into(), points: vec![(1.0, 2.0), (10.0, 3.0)] }];
        plot_lines(&path, "t", "x", "y", Scale::Log10, &s).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("<svg"));
        let path = dir.path().join("b.svg");
        plot_bars(&path, "t", "ns", &[("floor".into(), 80.0), ("spin".into(), 200.0)]).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("<svg"));
    }
}
