//! The benchmark's findings: a markdown table for people, JSON for machines.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// One measured figure, with its target when it has one.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Figure {
    /// What was measured, in words.
    pub(crate) name: String,
    /// The value in `unit`.
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
    /// The target, in words (`<= 1.5x EVALSHA`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
    /// Whether the target was met.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pass: Option<bool>,
}

impl Figure {
    pub(crate) fn new(name: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Figure {
            name: name.into(),
            value,
            unit,
            target: None,
            pass: None,
        }
    }

    /// A latency in microseconds.
    pub(crate) fn micros(name: impl Into<String>, value: Duration) -> Self {
        Figure::new(name, value.as_nanos() as f64 / 1000.0, "µs")
    }

    pub(crate) fn target(mut self, target: impl Into<String>, pass: bool) -> Self {
        self.target = Some(target.into());
        self.pass = Some(pass);
        self
    }

    fn display_value(&self) -> String {
        let v = self.value;
        let number = if v.fract() == 0.0 || v.abs() >= 100.0 {
            format!("{v:.0}")
        } else if v.abs() >= 10.0 {
            format!("{v:.1}")
        } else if v.abs() >= 0.01 && self.pass == Some(false) {
            // Enough digits that a miss does not read as meeting its target (a Jain index of
            // 0.9985 against >= 0.999 is not "1.00").
            let mut digits = format!("{v:.4}");
            while digits.ends_with('0') && digits.len() > digits.find('.').map_or(0, |dot| dot + 3)
            {
                digits.pop();
            }
            digits
        } else if v.abs() >= 0.01 {
            format!("{v:.2}")
        } else {
            format!("{v:.4}")
        };
        if self.unit.is_empty() {
            number
        } else {
            format!("{number} {}", self.unit)
        }
    }
}

/// The figures of one section, with notes on what limits them.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Section {
    pub(crate) key: &'static str,
    pub(crate) title: &'static str,
    pub(crate) figures: Vec<Figure>,
    pub(crate) notes: Vec<String>,
}

/// The sections in the order the report shows and numbers them (each file's doc comment
/// says its number), whatever order they were measured in.
const REPORT_ORDER: [&str; 11] = [
    "limit",
    "uncontended",
    "handoff",
    "fairness",
    "queue",
    "many-locks",
    "resources",
    "churn",
    "replication",
    "scripts",
    "processes",
];

/// A section's number in the report (1-based).
fn section_number(key: &str) -> usize {
    REPORT_ORDER
        .iter()
        .position(|known| *known == key)
        .map_or(REPORT_ORDER.len() + 1, |index| index + 1)
}

impl Section {
    pub(crate) fn new(key: &'static str, title: &'static str) -> Self {
        Section {
            key,
            title,
            figures: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, figure: Figure) {
        self.figures.push(figure);
    }

    pub(crate) fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }
}

/// Where and how the benchmark ran.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RunInfo {
    pub(crate) started_unix_s: u64,
    pub(crate) quick: bool,
    pub(crate) pool_size: usize,
    pub(crate) cpus: usize,
    pub(crate) cpu_model: String,
    pub(crate) redis_version: String,
    pub(crate) duration_s: f64,
}

/// Everything one run found.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) run: RunInfo,
    pub(crate) sections: Vec<Section>,
}

impl Report {
    pub(crate) fn markdown(&self) -> String {
        let mut out = String::new();
        let run = &self.run;
        let _ = writeln!(
            out,
            "fairlock-bench{}: {} CPU(s) ({}), shared with redis-server {}; pool size {}; {:.0} s\n",
            if run.quick { " --quick" } else { "" },
            run.cpus,
            run.cpu_model,
            run.redis_version,
            run.pool_size,
            run.duration_s,
        );
        out.push_str("| # | figure | value | target | result |\n|---|---|---|---|---|\n");
        let mut sections: Vec<&Section> = self.sections.iter().collect();
        sections.sort_by_key(|section| section_number(section.key));
        for section in &sections {
            for figure in &section.figures {
                let result = match figure.pass {
                    Some(true) => "pass",
                    Some(false) => "**miss**",
                    None => "",
                };
                let _ = writeln!(
                    out,
                    "| {} {} | {} | {} | {} | {} |",
                    section_number(section.key),
                    section.key,
                    figure.name,
                    figure.display_value(),
                    figure.target.as_deref().unwrap_or(""),
                    result
                );
            }
        }
        let notes: Vec<_> = sections.iter().filter(|s| !s.notes.is_empty()).collect();
        if !notes.is_empty() {
            out.push_str("\nNotes:\n");
            for section in notes {
                for note in &section.notes {
                    let _ = writeln!(out, "- {}: {note}", section.key);
                }
            }
        }
        out
    }

    /// Writes `<dir>/fairlock-bench-<unix time>.json` and `<dir>/latest.json`; returns the first.
    pub(crate) fn write_json(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let path = dir.join(format!("fairlock-bench-{}.json", self.run.started_unix_s));
        std::fs::write(&path, &json)?;
        std::fs::write(dir.join("latest.json"), &json)?;
        Ok(path)
    }
}

/// The workspace's target directory: `CARGO_TARGET_DIR` if set, else the nearest ancestor of
/// this executable that Cargo marked as a target directory (`CACHEDIR.TAG`), else `target/`
/// beside the workspace manifest this crate was built from.
pub(crate) fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe
            .ancestors()
            .skip(1)
            .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        {
            return dir.to_path_buf();
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missed_target_shows_the_digits_that_miss_it() {
        let jain = Figure::new("Jain's index", 0.9985, "").target(">= 0.999", false);
        assert_eq!(jain.display_value(), "0.9985");
        let ratio = Figure::new("ratio", 1.504, "x").target("<= 1.5x", false);
        assert_eq!(ratio.display_value(), "1.504 x");
        let plain = Figure::new("ratio", 1.53, "x").target("<= 1.5x", false);
        assert_eq!(plain.display_value(), "1.53 x");
        let met = Figure::new("ratio", 1.4996, "x").target("<= 1.5x", true);
        assert_eq!(met.display_value(), "1.50 x");
        assert_eq!(Figure::new("x", 0.9985, "").display_value(), "1.00");
    }
}
