//! Text helpers shared by the report and the diff: durations and aligned tables.

use std::fmt;

/// Nanoseconds as milliseconds with one decimal: `12.3 ms`.
pub(crate) fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// Nanoseconds (fractional, e.g. per request) as milliseconds with two decimals.
pub(crate) fn ms_f(ns: f64) -> String {
    format!("{:.2} ms", ns / 1e6)
}

/// Signed nanoseconds as milliseconds with two decimals and an explicit sign.
pub(crate) fn ms_delta(ns: f64) -> String {
    format!("{:+.2} ms", ns / 1e6)
}

/// `part / whole` as a percentage with one decimal (`-` when `whole` is 0).
/// Bytes in decimal units, three significant figures: `512 B`, `1.05 MB`, `12.3 GB`.
pub(crate) fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = b as f64;
    let mut unit = 0;
    while value >= 999.5 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    match unit {
        0 => format!("{b} B"),
        _ if value >= 99.95 => format!("{value:.0} {}", UNITS[unit]),
        _ if value >= 9.995 => format!("{value:.1} {}", UNITS[unit]),
        _ => format!("{value:.2} {}", UNITS[unit]),
    }
}

pub(crate) fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// A table of text cells, columns padded to their widest cell; the first column is
/// left-aligned, the others right-aligned unless marked.
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
    left: Vec<bool>,
    indent: usize,
}

impl Table {
    /// A table with this header row.
    pub(crate) fn new(header: &[&str]) -> Table {
        let mut left = vec![false; header.len()];
        if let Some(first) = left.first_mut() {
            *first = true;
        }
        Table {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
            left,
            indent: 0,
        }
    }

    /// Left-aligns column `index` too.
    pub(crate) fn left_align(mut self, index: usize) -> Table {
        if let Some(l) = self.left.get_mut(index) {
            *l = true;
        }
        self
    }

    /// Indents every line by `spaces`.
    pub(crate) fn indent(mut self, spaces: usize) -> Table {
        self.indent = spaces;
        self
    }

    /// Adds a row.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self.left.len();
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = " ".repeat(self.indent);
            for (c, cell) in row.iter().enumerate() {
                let width = widths.get(c).copied().unwrap_or(0);
                let left = self.left.get(c).copied().unwrap_or(true);
                if c > 0 {
                    line.push_str("  ");
                }
                if left {
                    line.push_str(&format!("{cell:<width$}"));
                } else {
                    line.push_str(&format!("{cell:>width$}"));
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}
