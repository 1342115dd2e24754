//! More call sites than the process can remember (by address): events at
//! sites past the table's capacity have no `SOURCE`, and each such site is
//! counted as a lost string once; every event is still recorded, and the
//! sites remembered keep their `SOURCE` at their next events. (A C program reaches this with a
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
    config.history_long_len = 2 * SITES as u32;
    pfs_client::init_with(config).unwrap();
    let class = QUERY.get();
    // A site of its own for each (its address is its key), same file and
    // line; two rounds, so that each site has a second event.
    let sites: Vec<&'static CallSite> = (0..SITES)
        .map(|_| &*Box::leak(Box::new(CallSite::new("src/many.rs", 7))))
        .collect();
    for _ in 0..2 {
        for &site in &sites {
            drop(class.start_at(Some(site)));
        }
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
    let sources: Vec<Option<&str>> = s
        .long_statements
        .iter()
        .filter(|st| st.ev.class == index)
        .map(|st| {
            st.ev
                .source
                .and_then(|i| s.strings.get(&i))
                .map(String::as_str)
        })
        .collect();
    assert_eq!(sources.len(), 2 * SITES, "every event is recorded");
    let (first, second) = sources.split_at(SITES);
    assert_eq!(first, second, "a site has the same SOURCE at each event");
    assert!(
        first.iter().all(|s| matches!(s, None | Some("many.rs:7"))),
        "a SOURCE is the site's or none"
    );
    let named = first.iter().filter(|s| s.is_some()).count();
    let unnamed = (SITES - named) as u64;
    assert!(
        (12_000..=16_384).contains(&named),
        "sites remembered: {named}"
    );
    // Once per site (two sites whose addresses hash alike count once).
    let lost = s.lost[LostKind::Strings as usize];
    assert!(
        lost <= unnamed && lost * 100 >= unnamed * 95,
        "{lost} lost strings for {unnamed} sites without SOURCE"
    );
}
