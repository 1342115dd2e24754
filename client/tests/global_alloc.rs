//! The `GlobalAlloc` wrapper under a multi-threaded allocation storm: the
//! accounted totals match exactly what the test allocated in its scopes.
//! Its own process (an integration test file), with the wrapper as the
//! global allocator.

use std::alloc::Layout;

use pfs_client::alloc::PfsAllocator;
use pfs_client::{LazyMemoryClass, memory_scope};
use pfs_shm_layout::reader::{ReadOptions, snapshot};

#[global_allocator]
static A: PfsAllocator = PfsAllocator::new();

static STORM: LazyMemoryClass = LazyMemoryClass::new("memory/test/storm");
static KEPT: LazyMemoryClass = LazyMemoryClass::new("memory/test/kept");

const THREADS: u64 = 8;
const ROUNDS: u64 = 2000;

#[test]
fn storm_totals_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("alloc-storm").shm_dir(dir.path())).unwrap();
    STORM.get();
    KEPT.get();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<Box<[u8]>>>();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut kept = Vec::with_capacity(ROUNDS as usize / 100 + 1);
                for i in 0..ROUNDS {
                    let size = 1 + ((t * 7919 + i * 104_729) % 512) as usize;
                    {
                        let _s = memory_scope(&STORM);
                        // Box of `size` bytes (alloc + free), an aligned
                        // block, a zeroed one, and a realloc.
                        let b = vec![7u8; size].into_boxed_slice();
                        std::hint::black_box(&b);
                        drop(b);
                        let l = Layout::from_size_align(size, 256).unwrap();
                        let l2 = Layout::from_size_align(size * 2, 256).unwrap();
                        // SAFETY: `l` has a non-zero size (`size >= 1`), as
                        // `alloc` and `alloc_zeroed` require, and `size * 2`
                        // is a valid size at alignment 256 (`l2` exists), as
                        // `realloc` requires. Every pointer is checked
                        // non-null before use. `z` is valid for `size`
                        // initialised (zeroed) bytes while no other
                        // reference to them exists; the slice ends before
                        // `realloc`. Each block is freed once, with the
                        // layout it has then (`l`, then `l2` after
                        // `realloc`, which took ownership of `z`).
                        unsafe {
                            let p = std::alloc::alloc(l);
                            assert!(!p.is_null());
                            assert_eq!(p as usize % 256, 0, "alignment kept");
                            std::alloc::dealloc(p, l);
                            let z = std::alloc::alloc_zeroed(l);
                            assert!(!z.is_null());
                            assert!(std::slice::from_raw_parts(z, size).iter().all(|&x| x == 0));
                            let r = std::alloc::realloc(z, l, l2.size());
                            assert!(!r.is_null());
                            assert_eq!(r as usize % 256, 0);
                            std::alloc::dealloc(r, l2);
                        }
                    }
                    if i % 100 == 0 {
                        let _s = memory_scope(&KEPT);
                        kept.push(vec![1u8; 1000].into_boxed_slice());
                    }
                }
                // Handed to the main thread, which frees them after this
                // thread exited: frees on another thread.
                tx.send(kept).unwrap();
            })
        })
        .collect();
    drop(tx);
    for h in handles {
        h.join().unwrap();
    }
    let kept: Vec<Vec<Box<[u8]>>> = rx.iter().collect();
    let seg = pfs_shm_layout::Segment::open(
        std::fs::File::open(pfs_client::segment_path().unwrap()).unwrap(),
        false,
    )
    .unwrap();
    let totals = |name: &str| {
        let s = snapshot(&seg, &ReadOptions::default()).unwrap();
        let idx = s.classes.iter().find(|c| c.name == name).unwrap().index;
        s.memory_of(idx)
    };
    // Expected STORM figures: per round 4 allocs (box, aligned, zeroed,
    // realloc'd) and 4 frees.
    let mut bytes = 0u64;
    for t in 0..THREADS {
        for i in 0..ROUNDS {
            let size = 1 + (t * 7919 + i * 104_729) % 512;
            bytes += size + size + size + 2 * size;
        }
    }
    let n = THREADS * ROUNDS * 4;
    let m = totals("memory/test/storm");
    assert_eq!((m.count_alloc, m.count_free), (n, n));
    assert_eq!((m.bytes_alloc, m.bytes_free), (bytes, bytes));
    assert_eq!((m.current_count, m.current_bytes), (0, 0));
    let kept_n = THREADS * ROUNDS.div_ceil(100);
    let k = totals("memory/test/kept");
    assert_eq!((k.count_alloc, k.count_free), (kept_n, 0));
    assert_eq!(k.current_bytes, (kept_n * 1000) as i64);
    drop(kept);
    let k = totals("memory/test/kept");
    assert_eq!(
        (k.count_free, k.current_count, k.current_bytes),
        (kept_n, 0, 0)
    );
}
