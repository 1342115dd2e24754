//! A program that forgot `pfs_client::init()` is told so, once, when it
//! starts a statement or enters a stage (which it records nothing of);
//! a lock used before `init` (a static) is no reason to say it.

use std::io::Write;
use std::sync::{Arc, Mutex};

use pfs_client::{LazyStageClass, LazyStatementClass, LazyWaitClass, Operation};

static QUERY: LazyStatementClass = LazyStatementClass::new("statement/app/query");
static PARSE: LazyStageClass = LazyStageClass::new("stage/app/parse");
static LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/app/lock");

/// What the subscriber wrote.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[test]
fn a_forgotten_init_is_said_once_at_the_first_statement() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    // Waits before init: said nothing.
    for i in 0..3 {
        drop(LOCK.get().start(Operation::Lock, i));
    }
    assert!(!log.text().contains("not initialised"), "{}", log.text());
    // A statement and a stage, twice: said once, naming the first.
    for _ in 0..2 {
        let st = QUERY.start();
        PARSE.enter();
        drop(st);
    }
    // (Emitted from a thread of its own: waited for, at most a moment.)
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !log.text().contains("not initialised") && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let text = log.text();
    assert_eq!(
        text.matches("pfs-client is not initialised").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("statement \"statement/app/query\" is not recorded")
            && text.contains("pfs_client::init()"),
        "{text}"
    );
    assert!(pfs_client::segment_path().is_none());
}
