//! The layer beside a `fmt` layer with a per-layer filter (`EnvFilter`
//! "warn", as the README suggests), the program's subscriber set before
//! `pfs_client::init` (or with no init at all). The layer's warning that
//! nothing is recorded yet is given from inside a span's creation: an
//! event emitted there broke the per-layer filters, and `fmt` panicked
//! ("Span not found, this is a bug") on the first request span, which
//! never reached its handler. Now the warning reaches the log once, no
//! span is lost, and once `init` runs the spans are recorded.

mod common;

use pfs_tracing::PfsLayer;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

#[test]
fn a_filtered_fmt_layer_before_init_takes_the_warning_and_loses_no_span() {
    let out = common::Buffer::default();
    let fmt_out = out.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(PfsLayer::http()).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || fmt_out.clone())
                .with_filter(EnvFilter::new("warn")),
        ),
    )
    .unwrap();

    // Before init: each request span runs its body (a panic in the
    // subscriber would unwind out of `info_span!`).
    let mut ran = 0;
    for _ in 0..3 {
        tracing::info_span!("request", method = "GET", route = "/x").in_scope(|| {
            tracing::warn!("inside the request");
            ran += 1;
        });
    }
    assert_eq!(ran, 3);
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
    assert_eq!(text.matches("inside the request").count(), 3, "{text}");

    // Late init: recorded from here on.
    let (_dir, path) = common::init("filtered-fmt");
    for _ in 0..2 {
        tracing::info_span!("request", method = "GET", route = "/x").in_scope(|| {});
    }
    let sums = common::sums(&common::read(&path));
    assert_eq!(sums["statement/http/GET /x"].count, 2, "{:?}", sums.keys());
}
