//! What `tollgate audit` prints: a table for a person, JSON lines for scripts, or
//! PolicyReport YAML; and the progress line on a terminal's standard error.
//!
//! Everything is written as it is found, namespace by namespace: nothing waits for the
//! end but the summary, so output starts at once and memory stays flat (a PolicyReport is
//! written when its namespace is done, and is bounded: [`super::report`]).

use std::io::{self, Write};
use std::time::{Duration, Instant};

use tollgate_core::Audited;

use super::report::ReportBuilder;
use super::{NamespaceInfo, Totals};

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per finding, grouped by namespace, then a summary.
    Table,
    /// One JSON object per finding and line (the README documents the fields).
    Json,
    /// One `wgpolicyk8s.io/v1alpha2` PolicyReport per namespace with findings, as YAML.
    Policyreport,
}

/// Names are padded to this width in the table, so that short ones line up.
const NAME_WIDTH: usize = 40;
/// The longest rule name, `default-resources`.
const RULE_WIDTH: usize = 17;

/// Writes the findings in a format, as they come.
pub struct Writer<W: Write> {
    out: W,
    format: Format,
    /// Whether `out` is the terminal the progress line is drawn on.
    out_is_terminal: bool,
    pub progress: Progress,
    /// The current namespace's header is out (table).
    header: bool,
    report: Option<ReportBuilder>,
    /// When the audit started (the reports' timestamps).
    seconds: i64,
    reports_written: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W, format: Format, out_is_terminal: bool, progress: Progress) -> Self {
        Writer {
            out,
            format,
            out_is_terminal,
            progress,
            header: false,
            report: None,
            seconds: unix_now(),
            reports_written: 0,
        }
    }

    pub fn namespace_started(&mut self, ns: &NamespaceInfo) {
        self.header = false;
        if self.format == Format::Policyreport {
            self.report = Some(ReportBuilder::new(&ns.name, self.seconds));
        }
    }

    /// Before anything goes to standard output: a progress line on the same terminal
    /// would be in the way.
    fn make_room(&mut self) {
        if self.out_is_terminal {
            self.progress.clear();
        }
    }

    pub fn object(&mut self, ns: &NamespaceInfo, a: &Audited) -> io::Result<()> {
        self.progress.object();
        match self.format {
            Format::Table => {
                if a.findings.is_empty() {
                    return Ok(());
                }
                self.make_room();
                if !self.header {
                    writeln!(self.out, "NAMESPACE {}", ns.name)?;
                    self.header = true;
                }
                let object = format!("{}/{}", a.object.noun(), a.object.name);
                for f in &a.findings {
                    writeln!(
                        self.out,
                        "  {object:<NAME_WIDTH$}  {:<RULE_WIDTH$}  {:<5}  {}",
                        f.rule.as_str(),
                        f.status.as_str(),
                        f.message
                    )?;
                }
            }
            Format::Json => {
                if a.findings.is_empty() {
                    return Ok(());
                }
                self.make_room();
                for f in &a.findings {
                    serde_json::to_writer(&mut self.out, &a.finding_json(f))?;
                    self.out.write_all(b"\n")?;
                }
            }
            Format::Policyreport => {
                if let Some(r) = &mut self.report {
                    r.add(a);
                }
            }
        }
        Ok(())
    }

    pub fn namespace_done(&mut self) -> io::Result<()> {
        self.progress.namespace_done();
        if let Some(r) = self.report.take().filter(ReportBuilder::has_findings) {
            self.make_room();
            let text = serde_saphyr::to_string(&r.build()).map_err(io::Error::other)?;
            self.out.write_all(b"---\n")?;
            self.out.write_all(text.as_bytes())?;
            self.reports_written += 1;
        }
        if self.header {
            writeln!(self.out)?;
        }
        self.out.flush()
    }

    /// The summary: the table's last line; on standard error for the other formats, so
    /// that standard output stays one format.
    pub fn finish(&mut self, totals: &Totals) -> io::Result<()> {
        self.progress.clear();
        match self.format {
            Format::Table => writeln!(self.out, "{}", totals.summary())?,
            Format::Json => eprintln!("tollgate: {}", totals.summary()),
            Format::Policyreport => eprintln!(
                "tollgate: {} ({} PolicyReports)",
                totals.summary(),
                self.reports_written
            ),
        }
        self.out.flush()
    }
}

/// `audited 12,500 objects, 14 of 40 namespaces`, rewritten in place on standard error while
/// it is a terminal; nothing at all when it is not.
pub struct Progress {
    enabled: bool,
    shown: bool,
    last: Option<Instant>,
    objects: u64,
    done: u64,
    total: u64,
}

/// Redraws at most this often: a terminal is slower than the audit.
const REDRAW: Duration = Duration::from_millis(100);

impl Progress {
    pub fn new(enabled: bool) -> Progress {
        Progress {
            enabled,
            shown: false,
            last: None,
            objects: 0,
            done: 0,
            total: 0,
        }
    }

    pub fn set_total(&mut self, namespaces: u64) {
        self.total = namespaces;
        self.draw();
    }

    fn object(&mut self) {
        self.objects += 1;
        if self.last.is_none_or(|t| t.elapsed() >= REDRAW) {
            self.draw();
        }
    }

    fn namespace_done(&mut self) {
        self.done += 1;
        self.draw();
    }

    pub fn line(&self) -> String {
        format!(
            "audited {} objects, {} of {} namespaces",
            thousands(self.objects),
            thousands(self.done),
            thousands(self.total)
        )
    }

    fn draw(&mut self) {
        if !self.enabled {
            return;
        }
        self.last = Some(Instant::now());
        self.shown = true;
        let mut err = io::stderr().lock();
        let _ = write!(err, "\r\x1b[K{}", self.line());
        let _ = err.flush();
    }

    pub fn clear(&mut self) {
        if self.shown {
            self.shown = false;
            let mut err = io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}

/// 12500 as `12,500`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(12_500), "12,500");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn progress_reads_as_the_issue_says_and_is_silent_when_disabled() {
        let mut p = Progress::new(false);
        p.set_total(40);
        for _ in 0..12_500 {
            p.object();
        }
        for _ in 0..14 {
            p.namespace_done();
        }
        assert_eq!(p.line(), "audited 12,500 objects, 14 of 40 namespaces");
        assert!(!p.shown);
    }
}
