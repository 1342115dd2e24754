//! A warning given where its own output would wait for the caller: the
//! allocator wrapper's default class is misnamed, so the first accounted
//! allocation registers it (inside the class's `OnceLock`) and warns; the
//! subscriber that writes the warning allocates, and those allocations
//! wait for that same `OnceLock`. The warning's thread was joined there:
//! the program hung at its first allocation. Now the call waits for it a
//! moment only, the program goes on, and the warning reaches the log once
//! the class is settled. Its own process (an integration test file), with
//! the wrapper as the global allocator.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pfs_client::LazyMemoryClass;
use pfs_client::alloc::PfsAllocator;

static MISNAMED: LazyMemoryClass = LazyMemoryClass::new("memroy/test/default");

#[global_allocator]
static A: PfsAllocator = PfsAllocator::with(std::alloc::System, &MISNAMED);

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_warning_from_a_class_registered_by_an_allocation_does_not_hang() {
    let out = Buffer::default();
    let writer = out.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("warn-alloc").shm_dir(dir.path())).unwrap();
    // An allocation on a thread of its own (its first accounted one
    // resolves the default class), watched from here.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let v = vec![1u8; 4096];
        std::hint::black_box(&v);
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(20))
        .expect("the allocation returned: the warning did not wait for itself");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
        if text.contains("memroy/test/default") {
            assert_eq!(
                text.matches("not a PFS memory instrument name").count(),
                1,
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no warning in the log: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
