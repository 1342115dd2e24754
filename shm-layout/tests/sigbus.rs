//! A segment file truncated while the reader has it mapped: reads must not
//! kill the process (SIGBUS), the damage must be reported, and a SIGBUS
//! outside any segment must still terminate the process as before.

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

mod common;

use common::{config, record_wait, wait_event};
use pfs_shm_layout::layout::*;
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::{
    ClassKind, Segment, SegmentConfig, SegmentError, SegmentWriter, TimerCalibration,
};

/// A segment file with one class, one thread and a few events.
fn populated() -> (tempfile::NamedTempFile, SegmentWriter) {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    let cfg = config("shrink", 2, 3);
    let seg = Segment::create(
        tmp.reopen().unwrap(),
        &cfg,
        TimerCalibration::NANOSECONDS,
        1,
        0,
    )
    .unwrap();
    let w = SegmentWriter::new(seg);
    let c = w
        .register_class("wait/synch/mutex/t/a", ClassKind::Mutex, FLAG_ENABLED)
        .unwrap();
    let slot = w.alloc_thread(1, 1, "t").unwrap();
    let rec = w.segment().record(slot.index);
    for id in 1..=5 {
        record_wait(rec, &wait_event(c, id, 1000));
    }
    (tmp, w)
}

fn open(tmp: &tempfile::NamedTempFile, writable: bool) -> Segment {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .open(tmp.path())
        .unwrap();
    Segment::open(f, writable).unwrap()
}

#[test]
fn reading_a_segment_truncated_under_the_mapping_reports_it() {
    let (tmp, _w) = populated();
    let seg = open(&tmp, false);
    let before = snapshot(&seg, &ReadOptions::default()).unwrap();
    assert_eq!(before.threads.len(), 1);
    assert!(seg.check().is_ok());

    // Truncate to a few bytes: every page of the mapping is now past EOF.
    File::options()
        .write(true)
        .open(tmp.path())
        .unwrap()
        .set_len(10)
        .unwrap();
    match seg.check() {
        Err(SegmentError::Shrunk { len: 10, need }) => {
            assert_eq!(need, seg.geometry().total_size as u64)
        }
        other => panic!("expected Shrunk, got {other:?}"),
    }
    let faults = pfs_shm_layout::sigbus::recovered_faults();
    // This read faults on its first access; the process survives and the
    // mapping reads as zeros.
    let after = snapshot(&seg, &ReadOptions::default());
    assert!(
        pfs_shm_layout::sigbus::recovered_faults() > faults,
        "the read went through the SIGBUS handler"
    );
    if let Ok(s) = after {
        assert!(s.threads.is_empty(), "zeros hold no threads");
        assert!(s.classes.is_empty(), "zeros hold no classes");
    }
    assert!(matches!(seg.check(), Err(SegmentError::Shrunk { .. })));
    drop(seg);

    // Opening the truncated file is an ordinary refusal.
    let f = File::open(tmp.path()).unwrap();
    assert!(matches!(
        Segment::open(f, false),
        Err(SegmentError::Truncated { len: 10, .. })
    ));
}

#[test]
fn a_fault_while_writing_setup_is_survived_too() {
    let (tmp, _w) = populated();
    let seg = open(&tmp, true);
    File::options()
        .write(true)
        .open(tmp.path())
        .unwrap()
        .set_len(0)
        .unwrap();
    // A store into the (now missing) setup section.
    pfs_shm_layout::setup::set_consumers(&seg, "%", false);
    pfs_shm_layout::setup::set_instruments(&seg, "%", Some(false), None);
    assert!(matches!(
        seg.check(),
        Err(SegmentError::Shrunk { len: 0, .. })
    ));
}

#[test]
fn a_file_regrown_after_the_fault_is_reported_unreadable() {
    let (tmp, w) = populated();
    let seg = open(&tmp, false);
    let size = w.segment().geometry().total_size as u64;
    let f = File::options().write(true).open(tmp.path()).unwrap();
    f.set_len(0).unwrap();
    let _ = snapshot(&seg, &ReadOptions::default());
    f.set_len(size).unwrap();
    assert!(matches!(seg.check(), Err(SegmentError::Unreadable)));
}

#[test]
fn many_segments_fault_independently() {
    let files: Vec<_> = (0..8).map(|_| populated()).collect();
    let segs: Vec<_> = files.iter().map(|(t, _)| open(t, false)).collect();
    for (i, (t, _)) in files.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        File::options()
            .write(true)
            .open(t.path())
            .unwrap()
            .set_len(0)
            .unwrap();
        let _ = snapshot(&segs[i], &ReadOptions::default());
    }
    for (i, s) in segs.iter().enumerate() {
        let snap = snapshot(s, &ReadOptions::default()).unwrap();
        if i % 2 == 0 {
            assert!(s.check().is_err(), "segment {i} was truncated");
        } else {
            assert!(s.check().is_ok(), "segment {i} is intact");
            assert_eq!(snap.threads.len(), 1, "segment {i} still reads");
        }
    }
}

/// A private tmpfs of `size` bytes, unmounted on drop (needs root, as the
/// test suite runs).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: usize) -> Self {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let opts = CString::new(format!("size={size}")).unwrap();
        // SAFETY: every pointer is to a NUL-terminated C string that
        // outlives the call (the `c"tmpfs"` literals are static, `target`
        // and `opts` are live locals); mount(2) only reads them and writes
        // no memory of this process. Mounting over a fresh temporary
        // directory changes nothing else the test process uses.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mount tmpfs (this test needs root): {}",
            std::io::Error::last_os_error()
        );
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.0.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `target` is a live NUL-terminated C string that
        // umount2(2) only reads; detaching the tmpfs that `mount` put on our
        // own temporary directory writes no memory of this process (with
        // MNT_DETACH, files still open on it keep working).
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A segment whose header claims container pages that were never
/// reserved, on a full tmpfs: reading a hole needs a page the volume
/// cannot give, so the read raises SIGBUS although the file is long
/// enough. The reader survives and `check` reports `Unreadable`.
#[test]
fn a_hole_on_a_full_tmpfs_is_survived_and_reported_unreadable() {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    let fs = Tmpfs::mount(1 << 20);
    let path = fs.0.path().join("hostile.pfs");
    let cfg = SegmentConfig {
        history_long_len: 4,
        task_slots: 4,
        ..config("holes", 2, 64)
    };
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let seg = Segment::create(file, &cfg, TimerCalibration::NANOSECONDS, 1, 0).unwrap();
    let g = *seg.geometry();
    assert!(
        g.total_size > 1 << 20,
        "the segment ({} B) must not fit the volume",
        g.total_size
    );
    // Hostile: every page "added" and active, none reserved.
    let c = seg.container_header();
    c.pages_added
        .store(u64::from(g.max_pages), Ordering::Release);
    for s in seg.page_states() {
        s.store(PAGE_ACTIVE, Ordering::Release);
    }
    drop(seg);
    // Fill the volume.
    let mut filler = File::create(fs.0.path().join("filler")).unwrap();
    let chunk = vec![1u8; 64 << 10];
    while filler.write_all(&chunk).is_ok() {}

    let reader = Segment::open(File::open(&path).unwrap(), false).unwrap();
    let faults = pfs_shm_layout::sigbus::recovered_faults();
    let _ = snapshot(&reader, &ReadOptions::default());
    assert!(
        pfs_shm_layout::sigbus::recovered_faults() > faults,
        "reading an unbacked hole went through the SIGBUS handler"
    );
    assert!(
        matches!(reader.check(), Err(SegmentError::Unreadable)),
        "{:?}",
        reader.check()
    );
}

const CHILD_ENV: &str = "PFS_SIGBUS_TEST_CHILD";

/// In a child process: installs the handler (by opening a segment), then
/// faults on a truncated mapping that is NOT a segment. Must die of SIGBUS.
#[test]
fn a_fault_outside_segments_still_kills_the_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let (tmp, _w) = populated();
        let _seg = open(&tmp, false); // handler installed
        let other = tempfile::tempfile().unwrap();
        other.set_len(8192).unwrap();
        let map = memmap2::MmapOptions::new()
            .len(8192)
            .map_raw_read_only(&other)
            .unwrap();
        other.set_len(0).unwrap();
        // SAFETY: offset 4096 is inside the live 8192-byte mapping (`map`
        // is owned here), so `add` stays in bounds, and a `u8` read needs
        // no alignment and accepts any byte. The file behind that page was
        // truncated, so the access raises SIGBUS, which is the point of
        // the test: the kernel stops this child process before the value
        // could be used.
        let v = unsafe { std::ptr::read_volatile(map.as_ptr().add(4096)) };
        println!("survived a foreign SIGBUS, read {v}");
        std::process::exit(0);
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_fault_outside_segments_still_kills_the_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "child status {:?}, stdout {}, stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The creator's own mapping, protected from its creation on
/// (`create_with(.., protect: true, ..)`): a file truncated while it is
/// being created, or while its writer records, leaves the writer running
/// against zeros, says so (`faulted`), refuses to reserve more of the
/// file, and never grows it back.
#[test]
fn a_writer_s_protected_segment_survives_truncation_from_its_creation_on() {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    let cfg = config("writer", 2, 3);
    let seg = Segment::create_with(
        tmp.reopen().unwrap(),
        &cfg,
        TimerCalibration::NANOSECONDS,
        1,
        0,
        true,
        // Truncated before the segment is published: its last writes fault.
        |_| tmp.as_file().set_len(0).unwrap(),
    )
    .expect("created, protected");
    assert!(seg.protected() && seg.faulted());
    assert!(matches!(seg.reserve_page(0), Err(SegmentError::Faulted)));
    assert_eq!(tmp.as_file().metadata().unwrap().len(), 0);

    // Truncated while a writer records.
    let tmp = tempfile::NamedTempFile::new().unwrap();
    let seg = Segment::create_with(
        tmp.reopen().unwrap(),
        &cfg,
        TimerCalibration::NANOSECONDS,
        1,
        0,
        true,
        |_| {},
    )
    .unwrap();
    assert!(seg.protected() && !seg.faulted());
    let w = SegmentWriter::new(seg);
    let c = w
        .register_class("wait/synch/mutex/t/a", ClassKind::Mutex, FLAG_ENABLED)
        .unwrap();
    let slot = w.alloc_thread(1, 1, "t").unwrap();
    record_wait(w.segment().record(slot.index), &wait_event(c, 1, 1000));
    tmp.as_file().set_len(0).unwrap();
    let rec = w.segment().record(slot.index);
    for id in 2..=5 {
        record_wait(rec, &wait_event(c, id, 1000));
    }
    assert!(w.segment().faulted());
    // More threads than the first page holds: no page is reserved, the
    // file stays empty.
    for t in 2..40 {
        let _ = w.alloc_thread(t, t, "t");
    }
    assert_eq!(tmp.as_file().metadata().unwrap().len(), 0);
}

/// Reserving never grows a file another process truncated (before its
/// writer's mapping faulted: nothing has touched the lost pages yet).
#[test]
fn a_reservation_does_not_grow_a_truncated_file() {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    let cfg = config("grow", 2, 3);
    let seg = Segment::create(
        tmp.reopen().unwrap(),
        &cfg,
        TimerCalibration::NANOSECONDS,
        1,
        0,
    )
    .unwrap();
    tmp.as_file().set_len(0).unwrap();
    let _ = seg.reserve_page(1);
    assert_eq!(tmp.as_file().metadata().unwrap().len(), 0);
}
