//! The lines `outboxd dlq list` and `replay` print about events they skipped or failed: the
//! first [`MAX_LINES`] of a kind and a count of the rest, so a large DLQ does not flood the
//! terminal.

use crate::sink::dead_letter::DlqRecord;

/// Per-record lines printed for skipped or failed records before summarising the rest.
const MAX_LINES: usize = 50;

/// Lines about skipped or failed events: the first [`MAX_LINES`] and a count.
pub(super) struct Report {
    heading: &'static str,
    pub(super) lines: Vec<String>,
    pub(super) count: usize,
}

impl Report {
    pub(super) fn new(heading: &'static str) -> Report {
        Report { heading, lines: Vec::new(), count: 0 }
    }

    pub(super) fn push(&mut self, line: impl FnOnce() -> String) {
        self.count += 1;
        if self.lines.len() < MAX_LINES {
            self.lines.push(line());
        }
    }

    pub(super) fn print(&self) {
        if self.count == 0 {
            return;
        }
        println!("{} {}:", self.count, self.heading);
        for l in &self.lines {
            println!("  {l}");
        }
        if self.count > self.lines.len() {
            println!("  ... and {} more", self.count - self.lines.len());
        }
    }
}

pub(super) fn unreadable_line(r: &DlqRecord, why: &str) -> String {
    format!("{} id={} reason={}: {why}", r.position(), r.id_shown(), r.reason())
}
