//! A full volume never SIGBUSes the application: the segment directory is a
//! 1 MiB tmpfs, large enough for the segment's fixed part but not for a
//! page of thread records. Threads must run on, uninstrumented, with the
//! loss counted, and the application's log says why, once. Needs
//! permission to mount (root or CAP_SYS_ADMIN), as in CI and
//! `scripts/test`.

mod common;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex as StdMutex};

use common::Warnings;
use pfs_client::{LazyWaitClass, Operation, sync::Mutex};
use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::{ReadOptions, snapshot};

static M: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/full/m");

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        // Lazy: this process keeps its segment mapped until it exits.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn full_volume_counts_losses_instead_of_crashing() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"])
        .arg(dir.path())
        .status()
        .expect("run mount");
    assert!(
        status.success(),
        "cannot mount a size-limited tmpfs: this test needs root or CAP_SYS_ADMIN (run it through scripts/test in CI or as root)"
    );
    let _mount = Mount(dir.path().to_path_buf());
    let warnings = Arc::new(StdMutex::new(Vec::new()));
    {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(Warnings(warnings.clone()));
        tracing::subscriber::set_global_default(subscriber).unwrap();
    }

    pfs_client::init_with(pfs_client::Config::new("full").shm_dir(dir.path()))
        .expect("the fixed part fits in 1 MiB");
    let m = Arc::new(Mutex::new(&M, 0u64));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let m = m.clone();
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    *m.lock().unwrap() += 1;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for _ in 0..10 {
        let _w = M.get().start(Operation::Lock, 1);
    }
    assert_eq!(*m.lock().unwrap(), 4000, "the application did its work");

    let path = pfs_client::segment_path().unwrap();
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    let lost = |k: LostKind| seg.lost().counters[k as usize].load(Ordering::Relaxed);
    assert!(s.threads.is_empty(), "no thread could get a record");
    assert!(
        lost(LostKind::Threads) >= 5,
        "every thread's loss counted: {}",
        lost(LostKind::Threads)
    );
    assert!(
        lost(LostKind::Pages) >= 5,
        "each failed page reservation counted"
    );
    let warnings = warnings.lock().unwrap().clone();
    let full: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("cannot add a page of thread records"))
        .collect();
    assert_eq!(full.len(), 1, "said once: {warnings:?}");
    assert!(
        full[0].contains("No space left on device")
            && full[0].contains("enlarge the volume")
            && full[0].contains("container_pages"),
        "{}",
        full[0]
    );
    eprintln!(
        "full volume: thread_instances lost {}, container_pages lost {}",
        lost(LostKind::Threads),
        lost(LostKind::Pages)
    );
}
