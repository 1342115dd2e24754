//! The cost of the C ABI (issue 17): the same timed wait, in one run,
//! through the `extern "C"` functions and through the Rust API.
//!
//! * `c_abi/c_timed_wait`: `pfs_wait_begin_at` (what `PFS_WAIT_BEGIN`
//!   calls, with a static `pfs_site_t`: `SOURCE` recorded, as the Rust
//!   wait records its caller's line) + `pfs_wait_end` on a `pfs_wait_t`
//!   on the stack, called through function pointers hidden from the
//!   optimiser (`black_box`), so nothing is inlined into the loop: what a
//!   C caller pays, calls, shield and slot included.
//! * `c_abi/rust_timed_wait`: `LazyWaitClass::get().start()` and the
//!   guard's drop, as `client/benches/hot_path.rs` measures it.
//!
//! Both record the same instrument (enabled, timed). Target: C ≤ 1.1 ×
//! Rust. Run through `scripts/bench`, which prints the `c-abi:` line.

use std::hint::black_box;
use std::mem::MaybeUninit;

use criterion::{Criterion, criterion_group, criterion_main};
use pfs::{
    PFS_OP_LOCK, pfs_site_t, pfs_wait_begin_at, pfs_wait_class_register, pfs_wait_class_t,
    pfs_wait_end, pfs_wait_t,
};
use pfs_client::{Config, LazyWaitClass, Operation};

const NAME: &str = "wait/synch/mutex/bench/timed";
static TIMED: LazyWaitClass = LazyWaitClass::new(NAME);

type Begin =
    unsafe extern "C" fn(*mut pfs_wait_t, *const pfs_wait_class_t, u32, u64, *const pfs_site_t);

/// The call site, as `PFS_WAIT_BEGIN` declares one.
static SITE: pfs_site_t = pfs_site_t {
    file: c"c_abi.c".as_ptr(),
    line: 1,
};
type End = unsafe extern "C" fn(*mut pfs_wait_t);

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    pfs_client::init_with(Config::new("c-abi-bench").shm_dir(dir.path())).expect("init");
    let name = std::ffi::CString::new(NAME).unwrap();
    // SAFETY: a valid NUL-terminated string.
    let cls = unsafe { pfs_wait_class_register(name.as_ptr()) };
    assert!(!cls.is_null() && TIMED.get().is_enabled());

    let mut g = c.benchmark_group("c_abi");
    let begin: Begin = black_box(pfs_wait_begin_at as Begin);
    let end: End = black_box(pfs_wait_end as End);
    g.bench_function("c_timed_wait", |b| {
        b.iter(|| {
            let mut w = MaybeUninit::<pfs_wait_t>::uninit();
            // SAFETY: `w` is a local pfs_wait_t, begun and ended on this
            // thread; `cls` is a registered handle; `SITE` is static.
            unsafe {
                begin(w.as_mut_ptr(), black_box(cls), PFS_OP_LOCK, 0, &SITE);
                end(w.as_mut_ptr());
            }
        })
    });
    g.bench_function("rust_timed_wait", |b| {
        b.iter(|| drop(black_box(&TIMED).get().start(Operation::Lock, 0)))
    });
    g.finish();
    drop(dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
