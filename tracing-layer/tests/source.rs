//! `SOURCE` of what the layer records is the span's callsite (the
//! `span!`'s file and line, from its metadata), not the layer's own line:
//! two handlers' statements and stages tell apart by it. One test
//! function: `init` is once per process.

mod common;

use pfs_shm_layout::EventKind;
use pfs_tracing::PfsLayer;
use tracing_subscriber::prelude::*;

#[test]
fn statements_and_stages_show_their_spans_callsite() {
    let (_dir, path) = common::init("tracing-source");
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(PfsLayer::http()));
    let (statement_line, stage_line);
    {
        statement_line = line!() + 1;
        let job = tracing::info_span!("statement/test/job");
        let _in_job = job.enter();
        stage_line = line!() + 1;
        let load = tracing::info_span!("stage/test/load");
        drop(load.enter());
    }
    // Another callsite, another SOURCE; the same callsite twice, one.
    let other_line = line!() + 1;
    let run = || drop(tracing::info_span!("statement/test/job").entered());
    run();
    run();

    let s = common::read(&path);
    let source = |e: &pfs_shm_layout::reader::Event| {
        e.source
            .and_then(|i| s.strings.get(&i))
            .cloned()
            .unwrap_or_default()
    };
    let job = common::class_index(&s, "statement/test/job").unwrap();
    let stmts: Vec<String> = s
        .long_statements
        .iter()
        .filter(|st| st.ev.class == job)
        .map(|st| source(&st.ev))
        .collect();
    assert_eq!(
        stmts,
        [
            format!("source.rs:{statement_line}"),
            format!("source.rs:{other_line}"),
            format!("source.rs:{other_line}"),
        ]
    );
    let load = common::class_index(&s, "stage/test/load").unwrap();
    let stages: Vec<String> = s.long[EventKind::Stage.index()]
        .iter()
        .filter(|e| e.class == load)
        .map(source)
        .collect();
    assert_eq!(stages, [format!("source.rs:{stage_line}")]);
}
