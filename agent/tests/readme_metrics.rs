//! The README's metric table (the section after its `<!-- metrics:`
//! marker) names exactly the families the agent exports, OTLP's own
//! counters included: a family added to the model without a row, or a row
//! left after its family went, fails here.

use std::collections::BTreeSet;
use std::time::Duration;

use pfs_agent::export::model::{self, AgentStats};
use pfs_agent::segments::SegmentSet;
use pfs_agent::snapshot::Snapshotter;

static WAIT: pfs_client::LazyWaitClass =
    pfs_client::LazyWaitClass::new("wait/synch/mutex/readme/lock");
static STAGE: pfs_client::LazyStageClass = pfs_client::LazyStageClass::new("stage/readme/step");
static STATEMENT: pfs_client::LazyStatementClass =
    pfs_client::LazyStatementClass::new("statement/readme/query");
static MEMORY: pfs_client::LazyMemoryClass =
    pfs_client::LazyMemoryClass::new("memory/readme/buffer");

/// Metric names in the first column of the README's metric table,
/// without their `{labels}`.
fn readme_names() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let start = readme.find("<!-- metrics:").expect("the metrics marker");
    let table = readme[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| metric |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let mut out = BTreeSet::new();
    for row in table {
        let first = row.split('|').nth(1).expect("a first cell");
        for (i, name) in first.split('`').enumerate() {
            if i % 2 == 1 {
                let name = name.split('{').next().unwrap_or(name);
                assert!(out.insert(name.to_string()), "README names {name} twice");
            }
        }
    }
    out
}

#[test]
fn readme_names_every_exported_family() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("readme").shm_dir(dir.path())).unwrap();
    {
        let _q = STATEMENT.start();
        STAGE.enter();
        drop(WAIT.get().start(pfs_client::Operation::Lock, 0));
        MEMORY.alloc(64).free();
    }
    let shm = pfs_client::segment_path()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let snap = Snapshotter::new(
        SegmentSet::new(shm, Duration::from_secs(60)),
        Duration::ZERO,
    );
    let stats = AgentStats::default();
    stats.enable_otlp();
    let s = snap.get();
    let exported: BTreeSet<String> = model::families(&s, &snap.totals(), &stats)
        .iter()
        .map(|f| f.prometheus_name())
        .collect();
    assert!(
        exported.contains("pfs_agent_otlp_exports_total"),
        "OTLP's counters are in the model: {exported:?}"
    );
    let listed = readme_names();
    let missing: Vec<_> = exported.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&exported).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "README.md's metric table must name every exported family: missing {missing:?}, not exported {stale:?}"
    );
}
