//! A full segment directory (a private tmpfs, so this needs root, as the
//! suite runs): the agent cannot save its retired totals, so a dead
//! segment's file must stay (removing it would lose its counters at the
//! next restart). The failure is logged once, saying to free space; once
//! there is room, the segment is retired, saved and removed.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32};
use pfs_shm_layout::writer::EventData;
use pfs_shm_layout::{ClassKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration};
use pfs_tests::{Agent, sample};

const CLASS: &str = "wait/synch/mutex/t/a";

/// A private tmpfs of `size` bytes, unmounted (lazily) on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let opts = std::ffi::CString::new(format!("size={size},mode=0755")).unwrap();
        rustix::mount::mount(
            "tmpfs",
            dir.path(),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            opts.as_c_str(),
        )
        .unwrap_or_else(|e| panic!("mount tmpfs (this test needs root): {e}"));
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(self.0.path(), rustix::mount::UnmountFlags::DETACH);
    }
}

/// A small dead segment of `service` with `n` timed waits of [`CLASS`].
fn dead_segment(dir: &Path, service: &str, n: u64) -> PathBuf {
    let path = dir.join(format!("{service}.4242.pfs"));
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let cfg = SegmentConfig {
        service_name: service.into(),
        history_len: 2,
        max_classes: 4,
        max_strings: 4,
        records_per_page: 1,
        max_pages: 1,
        history_long_len: 1,
    };
    let seg = Segment::create(file, &cfg, TimerCalibration::NANOSECONDS, 4242, 1).unwrap();
    let w = SegmentWriter::new(seg);
    let class = w
        .register_class(CLASS, ClassKind::Mutex, FLAG_ENABLED | FLAG_TIMED)
        .unwrap();
    let slot = w.alloc_thread(1, 1, "t").unwrap();
    let rec = w.segment().record(slot.index);
    for i in 0..n {
        let e = EventData {
            event_id: i + 1,
            class,
            source: NONE_U32,
            object_name: NONE_U32,
            flags: EV_TIMED | EV_ENDED,
            ..Default::default()
        };
        rec.end_event(0, &e, None, true, true);
        rec.summarize(class as usize, true, 1_000_000 * (i + 1), 0, None);
    }
    path
}

fn poll(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

#[test]
fn a_dead_segment_stays_while_the_disk_is_full() {
    let fs = Tmpfs::mount(4 << 20);
    let d = fs.0.path();
    let seg = dead_segment(d, "svc", 5);
    // Fill the volume (the segment's pages are written already).
    let filler = d.join("filler");
    let mut f = File::create(&filler).unwrap();
    while f.write_all(&[0u8; 4096]).is_ok() {}
    drop(f);

    let agent = Agent::serve_with_args(d, &["--dead-retention", "1s"]).unwrap();
    assert!(
        poll(Duration::from_secs(15), || agent
            .guard
            .stderr()
            .contains("cannot save the retired totals")),
        "{}",
        agent.guard.describe()
    );
    std::thread::sleep(Duration::from_secs(3));
    let log = agent.guard.stderr();
    assert!(seg.exists(), "removed although not saved:\n{log}");
    assert_eq!(
        log.matches("cannot save the retired totals").count(),
        1,
        "logged once:\n{log}"
    );
    assert!(
        log.contains("No space left on device") && log.contains("free space"),
        "{log}"
    );
    let waits = |a: &Agent| {
        sample(
            &a.metrics().unwrap(),
            "pfs_events_waits_total",
            &[("service", "svc"), ("event_name", CLASS)],
        )
        .unwrap()
    };
    assert_eq!(waits(&agent), 5.0, "still exported");

    std::fs::remove_file(&filler).unwrap();
    assert!(
        poll(Duration::from_secs(15), || !seg.exists()),
        "{}",
        agent.guard.describe()
    );
    assert_eq!(waits(&agent), 5.0, "retired, still counted");
    drop(agent);
    let mut agent = Agent::serve_with_args(d, &["--dead-retention", "1s"]).unwrap();
    agent.wait_healthy(Duration::from_secs(20)).unwrap();
    assert_eq!(waits(&agent), 5.0, "counted after a restart");
}
