//! More call sites than the process can remember (by address): events at
//! sites past the table's capacity have no `SOURCE` and are counted as
//! lost strings, one each; every event is still recorded, and the sites
//! remembered keep their `SOURCE`. (A C program reaches this with a
//! `static inline` function in a header used by many files: one site per
//! file.) One test function: `init` is once per process.

use pfs_client::{CallSite, LazyStatementClass};
use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::{ReadOptions, snapshot};

static QUERY: LazyStatementClass = LazyStatementClass::new("statement/test/many_sites");

/// More distinct sites than the table's 16 384 slots; one string.
const SITES: usize = 20_000;

#[test]
fn sites_past_the_table_lose_their_source_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = pfs_client::Config::new("source-sites-test")
        .shm_dir(dir.path())
        .consumer("events_statements_history_long", true);
    config.history_long_len = SITES as u32;
    pfs_client::init_with(config).unwrap();
    let class = QUERY.get();
    for _ in 0..SITES {
        // A site of its own (its address is its key), same file and line.
        let site: &'static CallSite = Box::leak(Box::new(CallSite::new("src/many.rs", 7)));
        drop(class.start_at(Some(site)));
    }
    let path = pfs_client::segment_path().unwrap();
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    let index = s
        .classes
        .iter()
        .find(|c| c.name == QUERY.name())
        .unwrap()
        .index;
    let events: Vec<_> = s
        .long_statements
        .iter()
        .map(|st| &st.ev)
        .filter(|e| e.class == index)
        .collect();
    assert_eq!(events.len(), SITES, "every event is recorded");
    let with_source = events
        .iter()
        .filter(|e| {
            e.source.and_then(|i| s.strings.get(&i)).map(String::as_str) == Some("many.rs:7")
        })
        .count();
    let without = events.iter().filter(|e| e.source.is_none()).count();
    assert_eq!(
        with_source + without,
        SITES,
        "a SOURCE is the site's or none"
    );
    assert!(
        (12_000..=16_384).contains(&with_source),
        "sites remembered: {with_source}"
    );
    assert_eq!(
        s.lost[LostKind::Strings as usize],
        without as u64,
        "each event without SOURCE is counted"
    );
}
