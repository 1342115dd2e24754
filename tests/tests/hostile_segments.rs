//! Hostile and broken files in the segment directory (issue 10, part A).
//!
//! One agent (`--require-owner uid`) serves a directory where a real
//! `pfs-test-writer` keeps recording events. The cases are added one by
//! one; after each the test checks that
//!
//! * `pfs_agent_segment_errors_total{reason=...}` counts it,
//! * the agent's stderr has a log line naming the file and the reason,
//! * `/healthz` still answers, and
//! * the good writer's `pfs_events_waits_total` keeps increasing.
//!
//! Cases: random bytes, zero length, a truncated header, the right magic
//! with absurd offsets / sizes / counts, a huge sparse file, a future
//! layout version, a symlink to the good segment, a directory `x.pfs`, a
//! file owned by another uid, a world-writable file, and a valid, live
//! segment truncated to a few bytes while the agent has it mapped (its
//! exported totals must not go backwards). Finally the junk is removed and
//! the agent forgets it.
//!
//! A second test makes the agent itself take a `SIGBUS`: on a full tmpfs,
//! a segment whose header claims container pages that were never reserved
//! cannot be read (the kernel has no page to back the hole), and the agent
//! must survive it, drop that segment as `unreadable`, and keep exporting.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};
use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32};
use pfs_shm_layout::writer::EventData;
use pfs_shm_layout::{
    ClassKind, EventKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration,
};
use pfs_tests::{Agent, Sample, TEST_CLASSES, Tmpfs, Writer, poll, sample, writer_exe};

const WAITS: &str = "pfs_events_waits_total";
const ERRORS: &str = "pfs_agent_segment_errors_total";

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// A small valid segment (`max_pages` container pages) made with the
/// layout API; `events` waits of class `TEST_CLASSES[0]` recorded on one
/// thread.
fn make_segment(path: &Path, service: &str, events: u64, max_pages: u32) -> SegmentWriter {
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap();
    let cfg = SegmentConfig {
        service_name: service.into(),
        history_len: 4,
        max_classes: 8,
        max_strings: 16,
        records_per_page: 2,
        max_pages,
        history_long_len: 4,
        task_slots: 4,
    };
    let seg = Segment::create(
        file,
        &cfg,
        TimerCalibration::NANOSECONDS,
        std::process::id(),
        0,
    )
    .unwrap();
    let w = SegmentWriter::new(seg);
    let c = w
        .register_class(TEST_CLASSES[0], ClassKind::Mutex, FLAG_ENABLED | FLAG_TIMED)
        .unwrap();
    let slot = w.alloc_thread(1, 1, "victim").unwrap();
    let rec = w.segment().record(slot.index);
    for id in 1..=events {
        let e = EventData {
            event_id: id,
            end_event_id: id,
            class: c,
            timer_wait: 1000,
            flags: EV_TIMED | EV_ENDED,
            event_type: EventKind::Wait as u32,
            source: NONE_U32,
            object_name: NONE_U32,
            ..Default::default()
        };
        rec.end_event(EventKind::Wait, &e, None, true, true);
        rec.summarize(c as usize, EventKind::Wait, true, 1000, 0, None);
    }
    w
}

/// The first page of the live segment (a real header) with `patch`
/// applied, padded with a hole to the live file's length (or `len`).
fn header_file(path: &Path, good: &Path, len: Option<u64>, patch: impl FnOnce(&mut [u8])) {
    let mut header = vec![0u8; 4096];
    File::open(good).unwrap().read_exact(&mut header).unwrap();
    patch(&mut header);
    std::fs::write(path, &header).unwrap();
    let full = std::fs::metadata(good).unwrap().len();
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len.unwrap_or(full))
        .unwrap();
}

struct Harness {
    agent: Agent,
    dir: PathBuf,
    last_good: f64,
}

impl Harness {
    fn good_total(m: &[Sample]) -> Result<f64> {
        sample(
            m,
            WAITS,
            &[("service", "goodsvc"), ("event_name", TEST_CLASSES[0])],
        )
    }

    /// Waits until `reason` was counted `n` times, then checks health, the
    /// good writer's progress and the log line for `file`.
    fn expect(&mut self, file: &str, reason: &str, n: f64) {
        let m = poll(Duration::from_secs(20), || {
            let m = self.agent.metrics()?;
            let got = sample(&m, ERRORS, &[("reason", reason)]).unwrap_or(0.0);
            Ok((got >= n).then_some(m))
        })
        .unwrap_or_else(|e| {
            panic!(
                "{file}: {ERRORS}{{reason=\"{reason}\"}} never reached {n}: {e:#}\n{}",
                self.agent.guard.describe()
            )
        });
        assert_eq!(
            sample(&m, ERRORS, &[("reason", reason)]).unwrap(),
            n,
            "{file}: counted exactly once per refusal"
        );
        let h = self.agent.get("/healthz").unwrap();
        assert_eq!(h.status, 200, "{file}: agent unhealthy: {}", h.body);
        // The good segment keeps being exported, and keeps growing.
        let before = self.last_good;
        self.last_good = poll(Duration::from_secs(20), || {
            let v = Self::good_total(&self.agent.metrics()?)?;
            Ok((v > before).then_some(v))
        })
        .unwrap_or_else(|e| {
            panic!(
                "{file}: the good writer's counter stopped at {before}: {e:#}\n{}",
                self.agent.guard.describe()
            )
        });
        let log = self.agent.guard.stderr();
        assert!(
            log.lines()
                .any(|l| l.contains(file) && l.contains(reason) && l.contains("WARN")),
            "{file}: no warning naming the file and reason {reason}:\n{log}"
        );
        eprintln!(
            "hostile_segments: {file}: reason {reason} counted, good total {}",
            self.last_good
        );
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

#[test]
fn agent_survives_every_hostile_file_while_exporting_a_real_workload() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let mut writer = Writer::spawn(
        writer_exe!(),
        &[
            "loop",
            "--shm-dir",
            dir.to_str().unwrap(),
            "--service",
            "goodsvc",
            "--threads",
            "2",
        ],
    )
    .unwrap();
    let ready = writer.read_json(Duration::from_secs(20)).unwrap();
    let good = PathBuf::from(ready["segment"].as_str().unwrap());
    let agent = Agent::serve_with_env(&dir, &[("PFS_REQUIRE_OWNER", "uid".to_string())]).unwrap();
    let first = poll(Duration::from_secs(20), || {
        Harness::good_total(&agent.metrics()?).map(Some)
    })
    .unwrap_or_else(|e| {
        panic!(
            "good writer never exported: {e:#}\n{}",
            agent.guard.describe()
        )
    });
    let mut h = Harness {
        agent,
        dir: dir.clone(),
        last_good: first,
    };

    // Random bytes (never the magic, whatever the generator says).
    let mut junk = random_bytes(8192, 0x9e37_79b9_7f4a_7c15);
    junk[..8].copy_from_slice(b"NOTPFS!!");
    std::fs::write(h.path("random.pfs"), &junk).unwrap();
    h.expect("random.pfs", "bad_magic", 1.0);

    std::fs::write(h.path("empty.pfs"), b"").unwrap();
    h.expect("empty.pfs", "empty", 1.0);

    header_file(&h.path("short.pfs"), &good, Some(100), |_| {});
    h.expect("short.pfs", "truncated", 1.0);

    // The right magic with absurd offsets, sizes and counts (classes
    // section entry: offset at +8, size at +16, count at +24).
    let entry = 0x100 + 32;
    header_file(&h.path("offset.pfs"), &good, None, |b| {
        b[entry + 8..entry + 16].copy_from_slice(&(u64::MAX - 10).to_le_bytes())
    });
    h.expect("offset.pfs", "corrupt", 1.0);
    header_file(&h.path("size.pfs"), &good, None, |b| {
        b[entry + 16..entry + 24].copy_from_slice(&(1u64 << 60).to_le_bytes())
    });
    h.expect("size.pfs", "corrupt", 2.0);
    header_file(&h.path("count.pfs"), &good, None, |b| {
        b[entry + 24..entry + 28].copy_from_slice(&(1u32 << 31).to_le_bytes())
    });
    h.expect("count.pfs", "corrupt", 3.0);
    // A 1 TiB sparse file whose header claims all of it.
    header_file(&h.path("huge.pfs"), &good, Some(1 << 40), |b| {
        b[0x18..0x20].copy_from_slice(&(1u64 << 40).to_le_bytes())
    });
    h.expect("huge.pfs", "too_large", 1.0);

    header_file(&h.path("future.pfs"), &good, None, |b| {
        b[8..12].copy_from_slice(&99u32.to_le_bytes())
    });
    h.expect("future.pfs", "unsupported_version", 1.0);

    std::os::unix::fs::symlink(&good, h.path("link.pfs")).unwrap();
    h.expect("link.pfs", "symlink", 1.0);

    std::fs::create_dir(h.path("x.pfs")).unwrap();
    h.expect("x.pfs", "not_regular", 1.0);

    // Valid segments that the policy refuses.
    drop(make_segment(&h.path("foreign.pfs"), "foreign", 3, 2));
    std::os::unix::fs::chown(h.path("foreign.pfs"), Some(12345), Some(12345)).unwrap();
    h.expect("foreign.pfs", "foreign_owner", 1.0);
    drop(make_segment(&h.path("open.pfs"), "open", 3, 2));
    std::fs::set_permissions(h.path("open.pfs"), std::fs::Permissions::from_mode(0o666)).unwrap();
    h.expect("open.pfs", "world_writable", 1.0);
    let m = h.agent.metrics().unwrap();
    for svc in ["foreign", "open"] {
        assert!(
            sample(&m, WAITS, &[("service", svc)]).is_err(),
            "refused segment {svc} must not be exported"
        );
    }

    // A valid, live segment (its flock held), exported, then truncated to
    // a few bytes while the agent has it mapped.
    let victim_path = h.path("victim.pfs");
    let victim = make_segment(&victim_path, "victim", 7, 2);
    let lock = File::open(&victim_path).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let victim_labels = [("service", "victim"), ("event_name", TEST_CLASSES[0])];
    poll(Duration::from_secs(20), || {
        let m = h.agent.metrics()?;
        Ok((sample(&m, WAITS, &victim_labels)? == 7.0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("victim never exported: {e:#}\n{}", h.agent.guard.describe()));
    File::options()
        .write(true)
        .open(&victim_path)
        .unwrap()
        .set_len(10)
        .unwrap();
    // Scrape hard while it is noticed: every read must survive.
    for _ in 0..20 {
        let r = h.agent.get("/metrics").unwrap();
        assert_eq!(r.status, 200);
    }
    h.expect("victim.pfs", "shrunk", 1.0);
    let m = h.agent.metrics().unwrap();
    assert_eq!(
        sample(&m, WAITS, &victim_labels).unwrap(),
        7.0,
        "the truncated segment's last totals stay exported (no counter goes backwards)"
    );
    drop(victim);
    drop(lock);

    // The agent still runs and still answers everything.
    assert!(
        h.agent.guard.try_wait().is_none(),
        "agent exited\n{}",
        h.agent.guard.describe()
    );
    let invalid = sample(
        &h.agent.metrics().unwrap(),
        "pfs_agent_segments",
        &[("state", "invalid")],
    )
    .unwrap();
    assert_eq!(invalid, 13.0, "every refused file is listed");

    // Removed files are forgotten.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p == good {
            continue;
        }
        if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
    poll(Duration::from_secs(20), || {
        let m = h.agent.metrics()?;
        let n = sample(&m, "pfs_agent_segments", &[("state", "invalid")])?;
        if n != 0.0 {
            bail!("{n} invalid files still listed");
        }
        Ok(Some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", h.agent.guard.describe()));
    h.expect("random.pfs", "bad_magic", 1.0); // counters are monotonic
    writer.finish(Duration::from_secs(10)).unwrap();
}

#[test]
fn agent_survives_sigbus_from_a_full_tmpfs() {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    let fs = Tmpfs::mount(16 << 20);
    let dir = fs.0.path().to_path_buf();
    let mut writer = Writer::spawn(
        writer_exe!(),
        &[
            "loop",
            "--shm-dir",
            dir.to_str().unwrap(),
            "--service",
            "goodsvc",
            "--threads",
            "2",
        ],
    )
    .unwrap();
    writer.read_json(Duration::from_secs(20)).unwrap();
    let agent = Agent::serve(&dir).unwrap();
    let first = poll(Duration::from_secs(20), || {
        Harness::good_total(&agent.metrics()?).map(Some)
    })
    .unwrap_or_else(|e| {
        panic!(
            "good writer never exported: {e:#}\n{}",
            agent.guard.describe()
        )
    });
    let mut h = Harness {
        agent,
        dir: dir.clone(),
        last_good: first,
    };

    // A segment claiming 64 active container pages, none reserved: built
    // under another name, so the agent sees it only once the volume is full.
    let staging = dir.join("holes.staging");
    let seg = make_segment(&staging, "holes", 0, 8192);
    let c = seg.segment().container_header();
    let max_pages = seg.segment().geometry().max_pages;
    assert!(
        seg.segment().geometry().total_size > 16 << 20,
        "the hostile segment must not fit the volume"
    );
    c.pages_added.store(u64::from(max_pages), Ordering::Release);
    for s in seg.segment().page_states() {
        s.store(pfs_shm_layout::layout::PAGE_ACTIVE, Ordering::Release);
    }
    drop(seg);
    let mut filler = File::create(dir.join("filler")).unwrap();
    let chunk = vec![1u8; 64 << 10];
    while filler.write_all(&chunk).is_ok() {}
    std::fs::rename(&staging, h.path("holes.pfs")).unwrap();
    h.expect("holes.pfs", "unreadable", 1.0);
    assert!(h.agent.guard.try_wait().is_none(), "agent exited");
    let log = h.agent.guard.stderr();
    assert!(log.contains("SIGBUS"), "the log explains the fault:\n{log}");
    writer.finish(Duration::from_secs(10)).unwrap();
    drop(h);
    drop(fs);
}
