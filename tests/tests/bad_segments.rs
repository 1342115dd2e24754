//! Bad files in the segment directory: `Segment::open` classifies each with
//! a typed error, and the agent keeps serving the good segment, counts the
//! bad ones as invalid and names each in its log.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pfs_shm_layout::{Segment, SegmentError};
use pfs_tests::{Agent, TEST_CLASSES, poll, sample, spawn_exact, writer_exe};

const BAD: [&str; 5] = [
    "garbage.pfs",
    "empty.pfs",
    "truncated.pfs",
    "badmagic.pfs",
    "future.pfs",
];

fn random_bytes(n: usize) -> Vec<u8> {
    let mut x = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    (0..n)
        .map(|_| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// Writes the five bad files next to `good`; returns their paths.
fn make_bad_files(dir: &Path, good: &Path) -> Vec<PathBuf> {
    let seg = std::fs::read(good).unwrap();
    assert!(seg.len() > 8192, "live segment is only {} bytes", seg.len());
    let mut garbage = random_bytes(8192);
    garbage[..8].copy_from_slice(b"NOTPFS!!"); // never the magic, whatever the RNG says
    let mut badmagic = seg.clone();
    badmagic[..8].fill(0);
    let mut future = seg.clone();
    future[8..12].copy_from_slice(&99u32.to_le_bytes());
    let contents: [Vec<u8>; 5] = [garbage, Vec::new(), seg[..100].to_vec(), badmagic, future];
    BAD.iter()
        .zip(contents)
        .map(|(name, bytes)| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        })
        .collect()
}

fn open(p: &Path) -> Result<Segment, SegmentError> {
    Segment::open(std::fs::File::open(p).unwrap(), false)
}

#[test]
fn open_returns_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, ready) = spawn_exact(writer_exe!(), dir.path(), "typed", 1, 10, 0).unwrap();
    let good = PathBuf::from(ready["segment"].as_str().unwrap());
    let bad_dir = tempfile::tempdir().unwrap();
    let files = make_bad_files(bad_dir.path(), &good);

    let live = open(&good).expect("the live segment opens");
    assert_eq!(live.service(), "typed");
    assert_eq!(u64::from(live.pid()), ready["pid"].as_u64().unwrap());

    match open(&files[0]) {
        Err(SegmentError::BadMagic(m)) => assert_eq!(m.to_le_bytes(), *b"NOTPFS!!"),
        other => panic!("garbage.pfs: expected BadMagic, got {other:?}"),
    }
    match open(&files[1]) {
        Err(SegmentError::Truncated { len: 0, need }) => assert!(need > 0),
        other => panic!("empty.pfs: expected Truncated {{ len: 0 }}, got {other:?}"),
    }
    match open(&files[2]) {
        Err(SegmentError::Truncated { len: 100, need }) => assert!(need > 100),
        other => panic!("truncated.pfs: expected Truncated {{ len: 100 }}, got {other:?}"),
    }
    match open(&files[3]) {
        Err(SegmentError::BadMagic(0)) => {}
        other => panic!("badmagic.pfs: expected BadMagic(0), got {other:?}"),
    }
    match open(&files[4]) {
        Err(
            e @ SegmentError::UnsupportedVersion {
                found: 99,
                supported: pfs_shm_layout::layout::LAYOUT_MAJOR,
                ..
            },
        ) => {
            let msg = e.to_string();
            assert!(msg.contains("99"), "message names the version: {msg}");
        }
        other => panic!("future.pfs: expected UnsupportedVersion {{ found: 99 }}, got {other:?}"),
    }
    // A byte-for-byte copy of a live segment is itself a valid segment.
    let copy = bad_dir.path().join("copy.pfs");
    std::fs::copy(&good, &copy).unwrap();
    let c = open(&copy).expect("a copy of a live segment opens");
    let snap = pfs_shm_layout::reader::snapshot(&c, &Default::default()).unwrap();
    assert_eq!(
        snap.threads.len(),
        1,
        "copied segment shows the writer's thread"
    );
    writer.finish(Duration::from_secs(10)).unwrap();
}

#[test]
fn agent_survives_bad_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, ready) = spawn_exact(writer_exe!(), dir.path(), "goodsvc", 2, 100, 0).unwrap();
    let good = PathBuf::from(ready["segment"].as_str().unwrap());
    let files = make_bad_files(dir.path(), &good);
    let agent = Agent::serve(dir.path()).unwrap();

    // (The empty file is reported once it stayed empty for the 10 s a
    // file being created is given.)
    let m = poll(Duration::from_secs(30), || {
        let m = agent.metrics()?;
        let invalid = sample(&m, "pfs_agent_segments", &[("state", "invalid")])?;
        let total = sample(
            &m,
            "pfs_events_waits_total",
            &[("service", "goodsvc"), ("event_name", TEST_CLASSES[0])],
        )?;
        Ok((invalid == 5.0 && total == 200.0).then_some(m))
    })
    .unwrap_or_else(|e| {
        panic!(
            "agent never reported 5 invalid segments and the good counts: {e:#}\n{}",
            agent.guard.describe()
        )
    });
    for name in TEST_CLASSES {
        let v = sample(
            &m,
            "pfs_events_waits_total",
            &[("service", "goodsvc"), ("event_name", name)],
        )
        .unwrap();
        assert_eq!(v, 200.0, "{name}");
    }
    assert_eq!(
        sample(&m, "pfs_agent_segments", &[("state", "live")]).unwrap(),
        1.0
    );
    let errors: f64 = m
        .iter()
        .filter(|s| s.name == "pfs_agent_segment_errors_total")
        .map(|s| s.value)
        .sum();
    assert!(
        errors >= 5.0,
        "pfs_agent_segment_errors_total sums to {errors}, expected >= 5"
    );
    assert!(
        m.iter()
            .all(|s| !s.labels.values().any(|v| BAD.contains(&v.as_str()))),
        "bad files must not appear as services"
    );

    // The log names every bad file (and not the good one as bad).
    let log = poll(Duration::from_secs(10), || {
        let log = agent.guard.stderr();
        Ok(BAD.iter().all(|f| log.contains(f)).then_some(log))
    })
    .unwrap_or_else(|_| {
        let log = agent.guard.stderr();
        let missing: Vec<_> = BAD.iter().filter(|f| !log.contains(*f)).collect();
        panic!("agent log does not mention {missing:?}:\n{log}")
    });
    for f in files {
        assert!(f.exists(), "the agent must not delete {}", f.display());
    }
    eprintln!("bad_segments: agent log:\n{log}");
    writer.finish(Duration::from_secs(10)).unwrap();
}
