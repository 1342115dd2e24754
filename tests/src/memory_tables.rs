//! The memory tables as the memory tests read them: a `pfs-agent serve`
//! with a control token, `TRUNCATE` through the control API, and the ten
//! value columns of the `memory/test/*` rows, keyed by chosen columns.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::{Agent, ChildGuard, get_json, rows};

/// The control token [`serve`] requires.
pub const TOKEN: &str = "memtoken";

/// The value columns of a memory table, in the order of [`Values`].
pub const COLS: [&str; 10] = [
    "count_alloc",
    "count_free",
    "sum_number_of_bytes_alloc",
    "sum_number_of_bytes_free",
    "low_count_used",
    "current_count_used",
    "high_count_used",
    "low_number_of_bytes_used",
    "current_number_of_bytes_used",
    "high_number_of_bytes_used",
];

/// One row's [`COLS`].
pub type Values = [i64; 10];

/// Runs `pfs-agent serve` on `dir` with [`TOKEN`] (written next to `dir`)
/// as its control token; gives the agent and its base URL.
pub fn serve(dir: &Path) -> Result<(ChildGuard, String)> {
    let token = dir.with_extension("token");
    std::fs::write(&token, format!("{TOKEN}\n"))?;
    let token = token.to_str().context("a UTF-8 temporary path")?;
    let Agent { guard, base } = Agent::serve_with_args(dir, &["--control-token-file", token])?;
    Ok((guard, base))
}

/// `TRUNCATE TABLE table` through the control API, then waits out the
/// agent's snapshot cache so that the next read sees it.
pub fn truncate(base: &str, table: &str) -> Result<()> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let url = format!("{base}/api/v1/tables/{table}/truncate");
    agent
        .post(&url)
        .header("authorization", &format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .send("{}")
        .with_context(|| format!("POST {url}"))?;
    std::thread::sleep(Duration::from_millis(1100));
    Ok(())
}

fn values(row: &Value) -> Result<Values> {
    let mut out = [0i64; 10];
    for (o, c) in out.iter_mut().zip(COLS) {
        *o = row[c]
            .as_i64()
            .with_context(|| format!("column {c} of {row}"))?;
    }
    Ok(out)
}

/// The rows of `table` for the `memory/test/*` instruments, keyed by the
/// values of the `key` columns then the event name, space separated;
/// sorted.
pub fn memory_rows(base: &str, table: &str, key: &[&str]) -> Result<Vec<(String, Values)>> {
    let t = get_json(&format!("{base}/api/v1/tables/{table}"))?;
    let mut out = Vec::new();
    for r in rows(&t)? {
        let name = r["event_name"].as_str().unwrap_or_default();
        if !name.starts_with("memory/test/") {
            continue;
        }
        let mut k: Vec<String> = key
            .iter()
            .map(|c| match &r[*c] {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            })
            .collect();
        k.push(name.to_string());
        out.push((k.join(" "), values(r)?));
    }
    out.sort();
    Ok(out)
}

/// Asserts that `got` equals `want` (sorted here), naming the columns.
pub fn expect(got: Vec<(String, Values)>, want: &[(&str, Values)], what: &str) {
    let mut want: Vec<(String, Values)> = want.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    want.sort();
    assert_eq!(got, want, "{what}: columns {COLS:?}");
}
