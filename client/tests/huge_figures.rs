//! Statement figures near 2^64 (a C program's `-1`, a bug's huge count)
//! saturate in the summaries instead of wrapping: a counter exported from
//! them never goes back to small values. One test function: `init` is
//! once per process.

use pfs_client::LazyStatementClass;
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, snapshot};

static QUERY: LazyStatementClass = LazyStatementClass::new("statement/app/huge");

#[test]
fn huge_statement_figures_saturate() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("huge").shm_dir(dir.path())).unwrap();
    for _ in 0..2 {
        let mut q = QUERY.start();
        q.add_errors(u64::MAX);
        q.add_errors(3); // in one statement too: no overflow panic
        q.add_warnings(u64::MAX);
        q.add_warnings(u64::MAX);
        q.set_rows_sent(u64::MAX - 1);
    }
    let seg = Segment::open(
        std::fs::File::open(pfs_client::segment_path().unwrap()).unwrap(),
        false,
    )
    .unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    let class = s
        .classes
        .iter()
        .find(|c| c.name == "statement/app/huge")
        .unwrap();
    let row = s
        .summary_rows()
        .find(|(c, _)| *c == class.index)
        .map(|(_, r)| *r)
        .unwrap();
    assert_eq!(row.count, 2);
    assert_eq!(row.statement.errors, u64::MAX, "saturated, not wrapped");
    assert_eq!(row.statement.warnings, u64::MAX, "saturated, not wrapped");
    assert_eq!(row.statement.rows_sent, u64::MAX, "saturated, not wrapped");
}

/// Sizes in range one by one, but together laying out a segment larger
/// than the agent reads by default, are refused by `validate` (and so by
/// `init`) with a message saying which to lower, not created for nothing
/// to export.
#[test]
fn a_segment_the_agent_would_refuse_is_not_created() {
    let mut cfg = pfs_client::Config::new("big");
    cfg.max_threads = 1 << 20;
    let e = cfg.validate().unwrap_err();
    assert!(
        matches!(e, pfs_client::ConfigError::SegmentTooLarge { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("--max-segment-size"), "{e}");
    assert!(pfs_client::Config::new("default").validate().is_ok());
}
