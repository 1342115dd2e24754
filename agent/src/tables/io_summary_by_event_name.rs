//! `file_summary_by_event_name` and `socket_summary_by_event_name`: each
//! process's file (or socket) instruments, exited threads included, with
//! their waits split by mode as PFS splits them: reads (`read`, `recv`),
//! writes (`write`, `send`) and everything else (`open`, `close`, `sync`,
//! `seek`, `connect`, ...), each with its count, time and average, and
//! the bytes read and written. The rows are those of
//! `events_waits_summary_global_by_event_name` for these instruments, and
//! share their `TRUNCATE`: truncating this table restarts its
//! instruments' rows there too (and nothing else: not the other I/O
//! table, not the by-thread summaries); truncating that one restarts
//! this one.
//! A row whose modes are not known (a process of a client older than
//! layout 8.1; a `TRUNCATE` baseline an older agent rewrote) shows the
//! instrument's totals and zero by mode (`columns::io_summary_values`).

use pfs_shm_layout::ClassKind;

use super::cell::Sink;
use super::columns::{head, io_summary_columns, io_summary_values, with_head};
use super::view::{NotTruncatable, PfsTable, Unreached, View};
use crate::aggregate::segment_global;
use crate::snapshot::Snapshot;
use crate::truncate::Baselines;

/// The I/O summary of the instruments of kind `File` or `Socket`.
#[derive(Debug)]
pub struct IoSummary(pub ClassKind);

impl IoSummary {
    /// Both tables: files, then sockets.
    pub const ALL: [IoSummary; 2] = [IoSummary(ClassKind::File), IoSummary(ClassKind::Socket)];
}

impl PfsTable for IoSummary {
    fn name(&self) -> &str {
        match self.0 {
            ClassKind::Socket => "socket_summary_by_event_name",
            _ => "file_summary_by_event_name",
        }
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        let mut cols = with_head(&["event_name"]);
        cols.extend(io_summary_columns());
        sink.columns(&cols);
        for (path, s) in &view.segments {
            for (n, (class_kind, sum)) in segment_global(s) {
                if class_kind == self.0 {
                    let sum = view.baselines_for(path, s).global_view(path, &n, &sum);
                    let mut row = head(s);
                    row.push(n.into());
                    row.extend(io_summary_values(&sum));
                    sink.row(&row);
                }
            }
        }
    }

    fn truncate(
        &self,
        baselines: &mut Baselines,
        snap: &Snapshot,
    ) -> Result<Unreached, NotTruncatable> {
        // One baseline per instrument, the waits' global summary's: its
        // rows of these instruments restart too; nothing else.
        baselines.truncate_global_of(snap, self.0);
        Ok(Unreached::new())
    }
}
