//! A program that installs the layer but never calls `pfs_client::init`
//! records nothing: the layer says so, once, through the program's own
//! logs, at the first span its rules make a statement (spans of other
//! kinds say nothing).

mod common;

use pfs_tracing::{PfsLayer, SpanMatch, StatementRule};
use tracing_subscriber::prelude::*;

#[test]
fn a_layer_without_init_says_once_that_it_records_nothing() {
    let out = common::Buffer::default();
    let fmt_out = out.clone();
    let layer = PfsLayer::builder()
        .statement(StatementRule::new(SpanMatch::name("job"), "jobs"))
        .build();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(layer).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || fmt_out.clone()),
        ),
    )
    .unwrap();
    tracing::info_span!("other").in_scope(|| {});
    let before = out.text();
    assert!(!before.contains("not initialised"), "{before}");
    for _ in 0..3 {
        tracing::info_span!("job").in_scope(|| {});
    }
    let text = out.text_with("pfs-client is not initialised");
    assert_eq!(
        text.matches("pfs-client is not initialised").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("WARN") && text.contains("pfs_client::init()"),
        "{text}"
    );
}
