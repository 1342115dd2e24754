//! `threads`: every instrumented thread of a live process, with its actor
//! (`PROCESSLIST_USER`, `PROCESSLIST_HOST`, `ROLE`) and whether it is
//! instrumented and keeps history, in MySQL's column order (the columns
//! MySQL has and this table does not, such as `PROCESSLIST_ID`, are
//! left out). A dead process's
//! threads are gone: its segment, kept for `--dead-retention`, shows its
//! final counters in the summary tables, not here.
//!
//! One row per thread record, by `THREAD_ID` within each process. An async task with its own event context
//! (layout 3.1) is a logical thread with a `THREAD_ID` of its own, seen in
//! the events tables, but it is not an OS thread and has no row here, by
//! design: its events are in the records of the threads that polled it
//! (and counted in their `*_summary_by_thread_by_event_name` rows).

use super::cell::{Cell, Sink};
use super::columns::{head, with_head, yes_no};
use super::view::{PfsTable, View};

/// The `threads` table.
#[derive(Debug)]
pub struct Threads;

impl PfsTable for Threads {
    fn name(&self) -> &str {
        "threads"
    }

    fn live_only(&self) -> bool {
        true
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&[
            "thread_id",
            "name",
            "type",
            "processlist_user",
            "processlist_host",
            "role",
            "instrumented",
            "history",
            "thread_os_id",
        ]));
        for (path, s) in &view.segments {
            // By THREAD_ID, whatever record each thread took.
            let mut threads: Vec<_> = view.threads_of(path, s).iter().collect();
            threads.sort_by_key(|t| t.thread_id);
            for t in threads {
                let (user, host, role) = match &t.actor {
                    Some((u, h, r)) => (Cell::Str(u), Cell::Str(h), Cell::Str(r)),
                    None => (Cell::Null, Cell::Null, Cell::Null),
                };
                let kind = if t.actor.is_some() {
                    "FOREGROUND"
                } else {
                    "BACKGROUND"
                };
                let mut r = head(s);
                r.extend([
                    t.thread_id.into(),
                    (&*t.name).into(),
                    kind.into(),
                    user,
                    host,
                    role,
                    yes_no(t.instrumented),
                    yes_no(t.history),
                    t.os_tid.into(),
                ]);
                sink.row(&r);
            }
        }
    }
}
