//! Torn-read detection: while 4 writer threads hammer self-checking waits
//! (EVENT_ID n carries object n*7919, bytes n^0x5555, spins n+3), this
//! process snapshots the segment as fast as it can. Every event and row
//! the reader accepts must be internally consistent.

use std::collections::HashMap;
use std::fs::File;
use std::time::{Duration, Instant};

use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{Event, ReadOptions, ReadStats, SegmentSnapshot, snapshot};
use pfs_tests::{Writer, torn, writer_exe};

const CLASS_NAMES: [&str; 3] = [
    "wait/synch/mutex/test/a",
    "wait/synch/rwlock/test/b",
    "wait/io/file/test/c",
];
const SECONDS: u64 = 5;

#[derive(Default)]
struct Checker {
    violations: u64,
    examples: Vec<String>,
    events: u64,
    in_progress: u64,
    rows: u64,
    snapshots: u64,
    /// (thread_id, class) -> last count seen.
    last_counts: HashMap<(u64, u32), u64>,
}

impl Checker {
    fn fail(&mut self, msg: String) {
        self.violations += 1;
        if self.examples.len() < 20 {
            self.examples.push(msg);
        }
    }

    fn check_event(&mut self, tid: u64, e: &Event, class_of: &HashMap<u32, usize>, what: &str) {
        self.events += 1;
        if e.end_event_id.is_none() {
            self.in_progress += 1;
        }
        let bad = torn::event_flaws(e, class_of);
        if !bad.is_empty() {
            self.fail(format!(
                "thread {tid} {what} event {}: {} ({e:?})",
                e.event_id,
                bad.join(", ")
            ));
        }
    }

    fn check(&mut self, snap: &SegmentSnapshot) {
        self.snapshots += 1;
        let class_of: HashMap<u32, usize> = snap
            .classes
            .iter()
            .filter_map(|c| {
                CLASS_NAMES
                    .iter()
                    .position(|n| *n == c.name)
                    .map(|i| (c.index, i))
            })
            .collect();
        if class_of.len() != 3 {
            self.fail(format!(
                "expected the 3 test classes, found {:?}",
                snap.classes
            ));
        }
        for t in &snap.threads {
            let mut max_id = 0;
            if let Some(e) = &t.waits_current {
                self.check_event(t.thread_id, e, &class_of, "current");
                max_id = max_id.max(e.event_id);
            }
            let mut prev = 0;
            for e in &t.waits_history {
                if e.end_event_id.is_none() {
                    self.fail(format!(
                        "thread {} history event {} not ended",
                        t.thread_id, e.event_id
                    ));
                }
                if e.event_id <= prev {
                    self.fail(format!(
                        "thread {} history not strictly ordered",
                        t.thread_id
                    ));
                }
                prev = e.event_id;
                self.check_event(t.thread_id, e, &class_of, "history");
                max_id = max_id.max(e.event_id);
            }
            let mut total = 0u64;
            for (class, s) in &t.rows {
                self.rows += 1;
                total += s.count;
                let mut bad = torn::row_flaws(s);
                let last = self.last_counts.entry((t.thread_id, *class)).or_insert(0);
                if s.count < *last {
                    bad.push(format!("count went down from {} to {}", *last, s.count));
                }
                *last = s.count;
                if !bad.is_empty() {
                    self.fail(format!(
                        "thread {} row class {class}: {}",
                        t.thread_id,
                        bad.join(", ")
                    ));
                }
            }
            // Rows are copied after the events: every event before the
            // newest one seen has already been summarised.
            if max_id > 0 && total + 1 < max_id && t.skipped_rows.is_empty() {
                self.fail(format!(
                    "thread {}: rows count {total} lags the newest event id {max_id} by more than one",
                    t.thread_id
                ));
            }
        }
    }
}

#[test]
fn torn_reads_are_never_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let secs = SECONDS.to_string();
    let mut w = Writer::spawn(
        writer_exe!(),
        &[
            "torn",
            "--shm-dir",
            d,
            "--service",
            "torn",
            "--threads",
            "4",
            "--seconds",
            &secs,
        ],
    )
    .unwrap();
    let ready = w.read_json(Duration::from_secs(20)).unwrap();
    assert_eq!(ready["ready"], true, "{ready}");
    let path = ready["segment"].as_str().unwrap().to_string();
    assert_eq!(path, w.segment_in(dir.path(), "torn").display().to_string());
    let seg = Segment::open(File::open(&path).unwrap(), false).unwrap();

    let mut ck = Checker::default();
    let mut stats = ReadStats::default();
    let mut errors = Vec::new();
    let opts = ReadOptions::default();
    let started = Instant::now();
    let limit = Duration::from_secs(SECONDS + 30);
    while w.guard.try_wait().is_none() {
        assert!(
            started.elapsed() < limit,
            "torn writer did not finish within {limit:?}"
        );
        match snapshot(&seg, &opts) {
            Ok(s) => {
                stats.add(&s.stats);
                ck.check(&s);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    let status = w.guard.try_wait().unwrap();
    assert!(
        status.success(),
        "torn writer failed: {status}\n{}",
        w.guard.describe()
    );
    let done = w.read_json(Duration::from_secs(5)).unwrap();
    assert_eq!(done["done"], true, "{done}");

    // After every thread exited, the folded totals are exactly what was
    // recorded, and nothing is left live or lost.
    let fin = snapshot(&seg, &opts).unwrap();
    assert!(
        fin.threads.is_empty(),
        "threads still live after exit: {:?}",
        fin.threads.len()
    );
    assert_eq!(fin.threads_exited, 4);
    assert_eq!(
        fin.lost,
        [0; pfs_shm_layout::layout::LOST_COUNTERS],
        "lost counters"
    );
    for (i, name) in CLASS_NAMES.iter().enumerate() {
        let idx = fin.classes.iter().find(|c| c.name == *name).unwrap().index;
        let got = fin
            .exited
            .iter()
            .find(|(c, _)| *c == idx)
            .map(|(_, s)| s.count)
            .unwrap_or(0);
        assert_eq!(
            got,
            done["per_class"][i].as_u64().unwrap(),
            "exited total of {name}"
        );
    }

    eprintln!(
        "torn_reads: {} snapshots, {} events validated ({} in progress), {} rows validated, \
         {} events recorded by the writer",
        ck.snapshots, ck.events, ck.in_progress, ck.rows, done["events"]
    );
    eprintln!(
        "torn_reads: reader stats: retries (rejected torn copies) {}, skipped rows {}, skipped events {}, \
         ended records {}, folded copies {}, invalid {}, restarts {}; snapshot errors {}",
        stats.retries,
        stats.skipped_rows,
        stats.skipped_events,
        stats.ended_records,
        stats.folded_copies,
        stats.invalid,
        stats.restarts,
        errors.len()
    );
    assert!(errors.is_empty(), "snapshot errors: {errors:?}");
    assert_eq!(
        ck.violations,
        0,
        "{} violations, e.g.:\n{}",
        ck.violations,
        ck.examples.join("\n")
    );
    assert!(ck.events > 10_000, "only {} events validated", ck.events);
    assert_eq!(stats.invalid, 0, "invalid entries seen");
}

/// The checker itself must reject torn copies (so the test above can fail).
#[test]
fn checker_rejects_torn_events() {
    let class_of: HashMap<u32, usize> = [(0, 0), (1, 1), (2, 2)].into();
    let mut ck = Checker::default();
    ck.check_event(1, &torn::consistent_copy(10), &class_of, "history");
    assert_eq!(ck.violations, 0, "{:?}", ck.examples);
    for (i, e) in torn::torn_copies(10).iter().enumerate() {
        let before = ck.violations;
        ck.check_event(1, e, &class_of, "history");
        assert_eq!(
            ck.violations,
            before + 1,
            "torn variant {i} not detected: {e:?}"
        );
    }
}
