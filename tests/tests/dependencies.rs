//! docs/DEPENDENCIES.md justifies every dependency: each crate that a
//! workspace member's `Cargo.toml` names (normal, dev or build, outside the
//! workspace) has a row, the row's "used by" cell names every member that
//! uses it, and names no member that does not.

use std::collections::{BTreeMap, BTreeSet};

use pfs_tests::workspace_root;

/// Workspace members by package name: the folder the docs call them by.
const MEMBERS: &[(&str, &str)] = &[
    ("pfs-shm-layout", "shm-layout"),
    ("pfs-client", "client"),
    ("pfs-client-c", "client-c"),
    ("pfs-tracing", "tracing-layer"),
    ("pfs-agent", "agent"),
    ("pfs-demo", "demo"),
    ("pfs-tests", "tests"),
];

/// Dependency name → the members (folders) that use it, from
/// `cargo metadata`.
fn uses() -> BTreeMap<String, BTreeSet<String>> {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in meta["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let (_, dir) = MEMBERS
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("workspace member {name} is not in MEMBERS"));
        for d in p["dependencies"].as_array().unwrap() {
            if d.get("path").is_some_and(|p| !p.is_null()) {
                continue; // a workspace member
            }
            uses.entry(d["name"].as_str().unwrap().to_string())
                .or_default()
                .insert(dir.to_string());
        }
    }
    uses
}

/// The rows of the doc's table: the crates a row justifies (backticked
/// names outside parentheses, which hold features) and its "used by".
fn rows(doc: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let mut first = String::new();
        let mut depth = 0;
        for c in cells[1].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => first.push(c),
                _ => {}
            }
        }
        let crates = first
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        let used_by = cells[2].split(',').map(|s| s.trim().to_string()).collect();
        out.push((crates, used_by));
    }
    out
}

#[test]
fn every_dependency_is_justified_with_its_users() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/DEPENDENCIES.md")).unwrap();
    let rows = rows(&doc);
    let uses = uses();
    let members: BTreeSet<&str> = MEMBERS.iter().map(|(_, d)| *d).collect();
    let mut wrong = Vec::new();
    for (dep, users) in &uses {
        let listed: BTreeSet<&str> = rows
            .iter()
            .filter(|(crates, _)| crates.contains(dep))
            .flat_map(|(_, u)| u.iter().map(String::as_str))
            .collect();
        if listed.is_empty() {
            wrong.push(format!("{dep} (used by {users:?}) has no row"));
            continue;
        }
        for u in users.iter().filter(|u| !listed.contains(u.as_str())) {
            wrong.push(format!("{dep}: used by {u}, which its rows do not name"));
        }
    }
    for (crates, used_by) in &rows {
        for u in used_by {
            if !members.contains(u.as_str()) {
                wrong.push(format!(
                    "row {crates:?}: {u:?} is not a workspace member folder"
                ));
            } else if !crates
                .iter()
                .any(|c| uses.get(c).is_some_and(|s| s.contains(u)))
            {
                wrong.push(format!("row {crates:?}: {u} uses none of them"));
            }
        }
        for c in crates.iter().filter(|c| !uses.contains_key(*c)) {
            wrong.push(format!("row {crates:?}: no member depends on {c}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/DEPENDENCIES.md is out of date:\n{}",
        wrong.join("\n")
    );
}
