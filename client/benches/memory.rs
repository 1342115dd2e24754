//! One accounted allocation: the explicit token API, and the `GlobalAlloc`
//! wrapper against the plain system allocator in the same run (see
//! docs/MEMORY.md).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use pfs_client::alloc::PfsAllocator;
use pfs_client::{LazyMemoryClass, memory_scope};

static BUF: LazyMemoryClass = LazyMemoryClass::new("memory/bench/buf");
static PFS: PfsAllocator = PfsAllocator::new();

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("bench-memory").shm_dir(dir.path())).unwrap();
    let _warm = BUF.alloc(1); // registers the class and the thread
    let l = Layout::from_size_align(64, 8).unwrap();
    let mut g = c.benchmark_group("memory");
    g.bench_function("token_alloc_free", |b| {
        b.iter(|| BUF.alloc(black_box(64)).free())
    });
    // Both cases time the same code around the allocator: the call, a null
    // check and the free.
    g.bench_function("system_alloc_free_64B", |b| {
        // SAFETY: `l` has a non-zero size (64 bytes), `alloc`'s one
        // precondition; a block it returns is freed once, by the allocator
        // that returned it, with the layout it was allocated with, and is
        // never dereferenced; a null result is not freed.
        b.iter(|| unsafe {
            let p = System.alloc(black_box(l));
            if !p.is_null() {
                System.dealloc(black_box(p), l);
            }
        })
    });
    g.bench_function("pfs_allocator_alloc_free_64B", |b| {
        let _s = memory_scope(&BUF);
        // SAFETY: the same argument as for `System` above, with `PFS`
        // allocating and freeing.
        b.iter(|| unsafe {
            let p = PFS.alloc(black_box(l));
            if !p.is_null() {
                PFS.dealloc(black_box(p), l);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
