//! Layout follows architecture: in every crate, the modules form layers.
//!
//! Each crate's `src/lib.rs` documents its top-level modules in a table
//! whose header row is `| layer | module | job |` (layer 0 is the bottom).
//! This test holds the code to that table:
//!
//! * every top-level module of `src/` (file or folder) has a row, and
//!   every row names a module that exists;
//! * a module refers only to modules of a strictly lower layer: any
//!   `crate::x`, `crate::{x, ..}`, `super::x` (from a top-level file) or,
//!   in a binary's modules, `<library>::x` counts, doc links included
//!   (as `shared/tools/module_cycles.py` counts them); code from the first
//!   `#[cfg(test)]` of a file on is left out;
//! * each module's header comment says its layer (`Layer N`);
//! * inside folder modules, at any depth, no two children of one module
//!   import each other, directly or around a longer cycle (`super::x`
//!   and `crate::a::b::x` paths resolved, doc links included).
//!
//! So no two modules import each other, and a newcomer can read a crate
//! from the bottom up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pfs_tests::workspace_root;

/// The crates checked, with the name their binary modules use for the
/// library (if the crate has a binary).
const CRATES: &[(&str, Option<&str>)] = &[
    ("shm-layout", None),
    ("client", None),
    ("client-c", None),
    ("tracing-layer", None),
    ("agent", Some("pfs_agent")),
    ("demo", None),
];

/// The layer of each module, from the table in `lib.rs`.
fn layer_table(lib_rs: &str) -> Result<BTreeMap<String, u32>, String> {
    let mut lines = lib_rs.lines().map(|l| l.trim_start_matches("//!").trim());
    if !lines.any(|l| l == "| layer | module | job |") {
        return Err("no `| layer | module | job |` table in src/lib.rs".into());
    }
    let mut out = BTreeMap::new();
    for line in lines.skip(1) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if !line.starts_with('|') || cells.len() < 4 {
            break;
        }
        let layer: u32 = cells[1]
            .parse()
            .map_err(|_| format!("layer {:?} is not a number in row {line:?}", cells[1]))?;
        let name = cells[2]
            .trim_matches(|c| c == '[' || c == ']' || c == '`')
            .to_string();
        if out.insert(name.clone(), layer).is_some() {
            return Err(format!("module {name} has two rows"));
        }
    }
    Ok(out)
}

/// Top-level modules of `src/` and their files.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let p = e.path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            let mut files = Vec::new();
            collect_rs(&p, &mut files);
            out.insert(name, files);
        } else if p.extension().is_some_and(|x| x == "rs") && name != "lib" && name != "main" {
            out.insert(name, vec![p]);
        }
    }
    out
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_rs(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Identifiers following `prefix` (`crate::x`, `crate::{x, y::z}`).
fn refs_after(text: &str, prefix: &str, out: &mut BTreeSet<String>) {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `foocrate::` is not `crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let n = ident(item.trim());
                if !n.is_empty() {
                    out.insert(n);
                }
            }
        } else {
            let n = ident(rest);
            if !n.is_empty() {
                out.insert(n);
            }
        }
    }
}

/// The top-level modules `file` (of module `module`, in `src`) refers to.
fn references(src: &Path, file: &Path, library: Option<&str>) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    let mut out = BTreeSet::new();
    refs_after(code, "crate::", &mut out);
    if let Some(lib) = library {
        refs_after(code, &format!("{lib}::"), &mut out);
    }
    // `super::x` names a top-level module from a file directly in src/ or
    // a folder's mod.rs; `super::super::x` from a file one folder down.
    let depth = file.strip_prefix(src).unwrap().components().count();
    let is_mod = file.file_name().is_some_and(|n| n == "mod.rs");
    let up = match (depth, is_mod) {
        (1, _) | (2, true) => Some("super::"),
        (2, false) | (3, true) => Some("super::super::"),
        _ => None,
    };
    if let Some(up) = up {
        let mut found = BTreeSet::new();
        refs_after(code, up, &mut found);
        out.extend(found.into_iter().filter(|n| n != "super"));
    }
    out
}

/// Every violation of the layering of the crate in `dir`.
fn problems(dir: &Path, library: Option<&str>) -> Vec<String> {
    let src = dir.join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let table = match layer_table(&lib) {
        Ok(t) => t,
        Err(e) => return vec![e],
    };
    let mods = modules(&src);
    let mut out = Vec::new();
    for name in mods.keys().filter(|m| !table.contains_key(*m)) {
        out.push(format!(
            "module {name} is not in the layer table of src/lib.rs"
        ));
    }
    for name in table.keys().filter(|m| !mods.contains_key(*m)) {
        out.push(format!(
            "the layer table names {name}, which is not a module of src/"
        ));
    }
    for (name, files) in &mods {
        let Some(&layer) = table.get(name) else {
            continue;
        };
        let own = [
            src.join(format!("{name}.rs")),
            src.join(name).join("mod.rs"),
        ];
        let header = own
            .iter()
            .find(|f| f.is_file())
            .map(|f| std::fs::read_to_string(f).unwrap())
            .unwrap_or_default();
        let doc: String = header
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join(" ");
        if !doc.contains(&format!("Layer {layer}")) {
            out.push(format!(
                "module {name}: its header comment does not say `Layer {layer}`"
            ));
        }
        for f in files {
            for r in references(&src, f, library) {
                match table.get(&r) {
                    Some(&l) if r != *name && l >= layer => out.push(format!(
                        "{} (module {name}, layer {layer}) refers to {r} (layer {l}): a module may only use lower layers",
                        f.strip_prefix(dir).unwrap().display()
                    )),
                    _ => {}
                }
            }
        }
    }
    out
}

/// A file's module path under `src` (`export/otlp/tls.rs` is
/// `export::otlp::tls`, a folder's `mod.rs` the folder's).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = path.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !["mod", "lib", "main"].contains(&stem) {
        path.push(stem.to_string());
    }
    path
}

/// The paths `file` (of module `me`) refers to, resolved from the crate
/// root: `crate::a::b`, and `super::...` chains (doc links included; code
/// from the first `#[cfg(test)]` on is left out).
fn resolved_refs(file: &Path, me: &[String]) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap();
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    // The paths at the start of `s` (`a::b`, or `a::{b, c::d}`: each
    // member of a group, one level deep).
    let paths_at = |s: &str| -> Vec<Vec<String>> {
        let ident = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        let mut prefix = Vec::new();
        let mut rest = s;
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                return group[..end]
                    .split(',')
                    .map(|item| {
                        let mut p = prefix.clone();
                        p.extend(item.trim().split("::").map(ident).filter(|i| !i.is_empty()));
                        p
                    })
                    .collect();
            }
            let id = ident(rest);
            if id.is_empty() {
                break;
            }
            rest = &rest[id.len()..];
            prefix.push(id);
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        vec![prefix]
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        out.extend(paths_at(&code[i + "crate::".len()..]));
    }
    for (i, _) in code.match_indices("super::") {
        let before = &code[..i];
        if before.ends_with("super::")
            || before
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue; // counted from the first `super::` of the chain
        }
        let mut rest = &code[i..];
        let mut up = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
            up += 1;
        }
        if up > me.len() {
            continue;
        }
        for tail in paths_at(rest) {
            let mut p = me[..me.len() - up].to_vec();
            p.extend(tail);
            out.push(p);
        }
    }
    out
}

/// Modules, at any depth, that import each other (directly or around a
/// longer cycle) among the children of one module: the layering that the
/// table checks at the top holds inside folders too. Each cycle is given
/// as its parent and its members.
fn nested_cycles(dir: &Path) -> Vec<String> {
    let src = dir.join("src");
    let mut files = Vec::new();
    collect_rs(&src, &mut files);
    // The child modules of each module (a file or a folder).
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let mut p = module_path(&src, f);
        while let Some(last) = p.pop() {
            children.entry(p.clone()).or_default().insert(last);
        }
    }
    // Edges between siblings: a file of `parent::a` refers to `parent::b`.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for f in &files {
        let me = module_path(&src, f);
        for r in resolved_refs(f, &me) {
            let k = me.iter().zip(&r).take_while(|(a, b)| a == b).count();
            if k >= me.len() || k >= r.len() {
                continue; // a module using its own children or its ancestors' items
            }
            let parent = me[..k].to_vec();
            let (a, b) = (&me[k], &r[k]);
            if children.get(&parent).is_some_and(|c| c.contains(b)) {
                edges
                    .entry(parent)
                    .or_default()
                    .insert((a.clone(), b.clone()));
            }
        }
    }
    let mut out = Vec::new();
    for (parent, es) in &edges {
        // Strongly connected sets: a reaches b and b reaches a.
        let reach = |from: &str| -> BTreeSet<String> {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from.to_string()];
            while let Some(n) = todo.pop() {
                for (_, b) in es.iter().filter(|(a, _)| *a == n) {
                    if seen.insert(b.clone()) {
                        todo.push(b.clone());
                    }
                }
            }
            seen
        };
        let mut done = BTreeSet::new();
        for (a, _) in es {
            if done.contains(a) {
                continue;
            }
            let from_a = reach(a);
            let cycle: BTreeSet<String> = from_a
                .iter()
                .filter(|b| reach(b).contains(a))
                .cloned()
                .collect();
            if !cycle.is_empty() {
                done.extend(cycle.iter().cloned());
                out.push(format!(
                    "in module `{}`, these import each other: {}",
                    if parent.is_empty() {
                        "crate".to_string()
                    } else {
                        parent.join("::")
                    },
                    cycle.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    out
}

#[test]
fn no_modules_import_each_other_at_any_depth() {
    let root = workspace_root();
    let mut all = Vec::new();
    for (dir, _) in CRATES {
        for p in nested_cycles(&root.join(dir)) {
            all.push(format!("{dir}: {p}"));
        }
    }
    assert!(all.is_empty(), "module cycles:\n{}", all.join("\n"));
}

/// The nested check finds a cycle between two files of one folder.
#[test]
fn the_nested_check_finds_siblings_that_import_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("top/deep")).unwrap();
    let write = |p: &str, s: &str| std::fs::write(src.join(p), s).unwrap();
    write("lib.rs", "pub mod top;\n");
    write("top/mod.rs", "mod a; mod b; mod deep;\nuse a::X;\n");
    write("top/a.rs", "use super::b::Y;\n");
    write("top/b.rs", "use crate::top::a::X;\n");
    write("top/deep/mod.rs", "mod c;\n");
    write("top/deep/c.rs", "use super::super::a::X;\n");
    let p = nested_cycles(dir.path());
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(p[0].contains("`top`") && p[0].contains("a, b"), "{p:#?}");
    write("top/b.rs", "\n");
    assert_eq!(nested_cycles(dir.path()), Vec::<String>::new());
    // A longer cycle, through a folder: a -> deep -> b -> a.
    write("top/a.rs", "use super::deep::c::Z;\n");
    write("top/deep/c.rs", "use super::super::b::Y;\n");
    write("top/b.rs", "use super::a::X;\n");
    let p = nested_cycles(dir.path());
    assert!(p.len() == 1 && p[0].contains("a, b, deep"), "{p:#?}");
    // A grouped import is followed member by member.
    write("top/deep/c.rs", "\n");
    write("top/b.rs", "use super::{deep, a::X};\n");
    write("top/a.rs", "use super::{b::Y};\n");
    let p = nested_cycles(dir.path());
    assert!(p.len() == 1 && p[0].contains("a, b"), "{p:#?}");
}

#[test]
fn every_crate_is_layered() {
    let root = workspace_root();
    let mut all = Vec::new();
    for (dir, library) in CRATES {
        for p in problems(&root.join(dir), *library) {
            all.push(format!("{dir}: {p}"));
        }
    }
    assert!(all.is_empty(), "layering broken:\n{}", all.join("\n"));
}

/// The check catches what it is for, on a small crate made for it.
#[test]
fn the_check_finds_upward_imports_and_missing_rows() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("top")).unwrap();
    let write = |p: &str, s: &str| std::fs::write(src.join(p), s).unwrap();
    write(
        "lib.rs",
        "//! | layer | module | job |\n//! |---|---|---|\n//! | 0 | [`low`] | x |\n//! | 1 | [`top`] | y |\n",
    );
    write("low.rs", "//! Layer 0: low.\nuse crate::top::Thing;\n");
    write("top/mod.rs", "//! Layer 1: top.\nmod inner;\n");
    write(
        "top/inner.rs",
        "use super::super::low::X;\n#[cfg(test)]\nmod t { use crate::top::y; }\n",
    );
    write("stray.rs", "//! Layer 0.\n");
    let p = problems(dir.path(), None);
    assert_eq!(p.len(), 2, "{p:#?}");
    assert!(p[0].contains("stray is not in the layer table"), "{p:#?}");
    assert!(
        p[1].contains("src/low.rs (module low, layer 0) refers to top (layer 1)"),
        "{p:#?}"
    );
    // Fixing the upward import and listing the module clears them.
    write("low.rs", "//! Layer 0: low.\n");
    write(
        "lib.rs",
        "//! | layer | module | job |\n//! |---|---|---|\n//! | 0 | [`low`] | x |\n//! | 0 | `stray` | z |\n//! | 1 | [`top`] | y |\n",
    );
    assert_eq!(problems(dir.path(), None), Vec::<String>::new());
    // A header that does not say its layer is found too.
    write("stray.rs", "//! Somewhere.\n");
    assert_eq!(problems(dir.path(), None).len(), 1);
}

/// The sidecar built without the demo (as a production image is) links no
/// `pfs-client`: the agent only reads segments.
#[test]
fn the_agent_without_its_demo_does_not_link_the_client() {
    let tree = |features: &[&str]| {
        let out = std::process::Command::new(env!("CARGO"))
            .args(["tree", "--offline", "-e", "normal", "-p", "pfs-agent"])
            .args(features)
            .current_dir(workspace_root())
            .output()
            .expect("cargo tree");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(
        tree(&[]).contains("pfs-client"),
        "the default build has the demo"
    );
    let lean = tree(&["--no-default-features"]);
    assert!(!lean.contains("pfs-client"), "{lean}");
    assert!(!lean.contains("pfs-demo"), "{lean}");
}
