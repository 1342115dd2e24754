//! Two threads initialising at once (a plugin and its host): one wins, the
//! other is told the process is already initialised, and the winner's
//! segment stays in place (the loser used to remove and recreate it, or
//! fail with "held by a running process").

use std::sync::{Arc, Barrier};

use pfs_client::{Config, InitError};

#[test]
fn concurrent_inits_make_one_segment_and_one_clear_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let start = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (start, d) = (start.clone(), dir.path().to_path_buf());
            std::thread::spawn(move || {
                start.wait();
                pfs_client::init_with(Config::new("race").shm_dir(&d))
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "{results:?}");
    let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert!(
        matches!(lost, InitError::AlreadyInitialized(_)),
        "the loser: {lost}"
    );
    let path = pfs_client::segment_path().expect("initialised");
    assert!(path.exists(), "the winner's segment is in place");
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files.len(), 1, "one segment: {files:?}");
}
