//! The README's table list (between its `tables:begin` and `tables:end`
//! markers) names exactly the tables the agent serves, in the same order.

#[test]
fn readme_lists_every_table() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let start = readme
        .find("<!-- tables:begin")
        .expect("tables:begin marker");
    let end = readme
        .find("<!-- tables:end -->")
        .expect("tables:end marker");
    let listed: Vec<&str> = readme[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    assert_eq!(
        listed,
        pfs_agent::tables::names(),
        "README.md's table list must name every table the agent serves, in registry order"
    );
}
