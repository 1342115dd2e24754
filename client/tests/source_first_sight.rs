//! `SOURCE` at a call site's first sight, raced by several threads at
//! once: each event has its call site's `file:line` (a thread that finds
//! another interning it interns it too; the string table gives one index
//! per string), never none. One test function: `init` is once per
//! process.

use std::sync::{Arc, Barrier};

use pfs_client::{LazyWaitClass, Operation};
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::{EventKind, Segment};

static RACE: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/race");

const THREADS: usize = 8;

/// The line of the first call site in `ten_sites`.
const FIRST_SITE: u32 = line!() + 3;
/// Ten call sites, each on a line of its own, in a row.
fn ten_sites() {
    RACE.get().start(Operation::Lock, 0).end();
    RACE.get().start(Operation::Lock, 1).end();
    RACE.get().start(Operation::Lock, 2).end();
    RACE.get().start(Operation::Lock, 3).end();
    RACE.get().start(Operation::Lock, 4).end();
    RACE.get().start(Operation::Lock, 5).end();
    RACE.get().start(Operation::Lock, 6).end();
    RACE.get().start(Operation::Lock, 7).end();
    RACE.get().start(Operation::Lock, 8).end();
    RACE.get().start(Operation::Lock, 9).end();
}

#[test]
fn every_event_has_its_source_at_a_raced_first_sight() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new("source-race-test")
            .shm_dir(dir.path())
            .consumer("events_waits_history_long", true),
    )
    .unwrap();
    let _ = RACE.get(); // registered before the race
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || {
                // Registered (the thread's first event) before the race.
                pfs_client::set_thread_name("racer");
                start.wait();
                ten_sites();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let path = pfs_client::segment_path().unwrap();
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    let class = s
        .classes
        .iter()
        .find(|c| c.name == RACE.name())
        .unwrap()
        .index;
    let waits: Vec<_> = s.long[EventKind::Wait.index()]
        .iter()
        .filter(|e| e.class == class)
        .collect();
    assert_eq!(waits.len(), THREADS * 10);
    for e in waits {
        let source = e.source.and_then(|i| s.strings.get(&i));
        let expected = format!(
            "source_first_sight.rs:{}",
            FIRST_SITE + e.object_instance as u32
        );
        assert_eq!(source, Some(&expected), "{e:?}");
    }
}
