//! The warning of a layer without `pfs_client::init` under a *scoped*
//! subscriber (`with_default`), which takes no event from inside its own
//! callbacks: it goes to standard error. The test runs itself as a child
//! process (`PFS_NO_INIT_CHILD=1`) to read that stream.

use std::process::Command;

use pfs_tracing::{PfsLayer, SpanMatch, StatementRule};
use tracing_subscriber::prelude::*;

const CHILD: &str = "PFS_NO_INIT_CHILD";

#[test]
fn a_scoped_subscriber_without_init_still_warns_once() {
    if std::env::var_os(CHILD).is_some() {
        let layer = PfsLayer::builder()
            .statement(StatementRule::new(SpanMatch::name("job"), "jobs"))
            .build();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            for _ in 0..3 {
                tracing::info_span!("job").in_scope(|| {});
            }
        });
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_scoped_subscriber_without_init_still_warns_once",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("pfs-client is not initialised").count(),
        1,
        "stderr: {err}"
    );
    assert!(err.contains("pfs_client::init()"), "{err}");
}
