//! grafana/: dashboard lint rules, provisioning files, and every panel query
//! run against two real Prometheus servers scraping `pfs-agent demo` (its
//! OTLP push on, to a real receiver), one with classic histograms (text scrapes) and one with native histograms
//! (`--enable-feature=native-histograms`, protobuf scrapes); and the
//! alert rules of deploy/prometheus in that Prometheus.
//!
//! Families not exported yet are listed in [`PENDING`]: a query that uses
//! only pending families must return NO data today, so that when they are
//! added this test fails until the list is emptied (never a silent skip).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use pfs_tests::{
    ChildGuard, OtlpReceiver, agent_bin, free_port, get_json, poll, wait_healthz, workspace_root,
};
use serde::Deserialize;
use serde_json::Value;

/// Metric-name prefixes of families the dashboards chart before the agent
/// exports them. Empty this list as the families land.
const PENDING: &[&str] = &[];

/// `pfs_` families without a `service` label (measured by the agent
/// itself); every other `pfs_` selector must filter by `$process`.
const NO_SERVICE: &[&str] = &["pfs_agent_", "pfs_timer_overhead_cycles"];

/// Dashboard files and their stable uids (links and provisioning rely on
/// them).
const DASHBOARDS: &[(&str, &str)] = &[("pfs-overview.json", "pfs-overview")];

/// The query variables every dashboard has (name, label it selects).
const VARIABLES: &[(&str, &str)] = &[
    ("job", "job"),
    ("namespace", "namespace"),
    ("pod", "pod"),
    ("process", "service"),
];

/// What Grafana substitutes for `$__rate_interval` in this test: the
/// scrape interval is 1 s, so Grafana's floor of four scrape intervals
/// would be 4 s; 15 s keeps a few samples in every window.
const RATE_INTERVAL: &str = "15s";
/// The range a top-k ranks over: the dashboard's whole time range…
const RANKING_RANGE: &str = "[$__range]";
/// …evaluated at its end, the same for every step of a range query.
const PINNED_AT_END: &str = " @ end()";
/// What the test's Prometheus has seen when the panels are queried, as
/// Grafana's `$__range`.
const RANGE: &str = "1m";

fn dashboards_dir() -> PathBuf {
    workspace_root().join("grafana/dashboards")
}

fn load(file: &str) -> Value {
    let p = dashboards_dir().join(file);
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()))
}

/// Every non-row panel, including panels nested in collapsed rows.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten());
        } else {
            out.push(p);
        }
    }
    out
}

fn targets(p: &Value) -> Vec<&Value> {
    p["targets"].as_array().into_iter().flatten().collect()
}

/// Metric names in a PromQL expression: identifiers followed by `{` or a
/// range selector, that are not functions, keywords or label names.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let b = expr.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    let mut depth = 0; // inside {...}
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' {
                i += 1;
            } else if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' => depth += 1,
            b'}' => depth -= 1,
            _ => {}
        }
        if depth == 0 && (c.is_ascii_alphabetic() || c == b'_') && (i == 0 || !is_ident(b[i - 1])) {
            let start = i;
            while i < b.len() && (is_ident(b[i]) || b[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            // A metric name is the one identifier outside braces followed
            // by a selector (functions and `by`/`on` are followed by `(`).
            if expr[i..].trim_start().starts_with('{') {
                out.insert(word.to_string());
            }
            continue;
        }
        i += 1;
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The label matchers of every `metric{...}` selector in `expr`.
fn selectors(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in metric_names(expr) {
        let mut rest = expr;
        while let Some(pos) = rest.find(&format!("{name}{{")) {
            let after = &rest[pos + name.len() + 1..];
            let end = after.find('}').unwrap_or(after.len());
            let boundary = pos == 0 || !is_ident(rest.as_bytes()[pos - 1]);
            if boundary {
                out.push((name.clone(), after[..end].to_string()));
            }
            rest = &after[end..];
        }
    }
    out
}

/// Whether every metric an expression (or a `label_values` query) reads
/// is pending.
fn only_pending(expr: &str) -> bool {
    let mut names = metric_names(expr);
    if let Some(rest) = expr.strip_prefix("label_values(") {
        let first: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        names.insert(first);
    }
    !names.is_empty() && names.iter().all(|m| is_pending(m))
}

fn is_pending(metric: &str) -> bool {
    PENDING.iter().any(|p| metric.starts_with(p))
}

/// Every lint problem of a dashboard.
fn lint(file: &str, uid: &str, d: &Value) -> Vec<String> {
    let mut p = Vec::new();
    let mut bad = |cond: bool, msg: String| {
        if !cond {
            p.push(format!("{file}: {msg}"));
        }
    };
    bad(d["uid"] == uid, format!("uid is {} (want {uid})", d["uid"]));
    bad(
        d["schemaVersion"].as_i64().is_some_and(|v| v >= 36),
        "schemaVersion < 36".into(),
    );
    bad(d["title"].is_string(), "no title".into());
    let vars: Vec<&Value> = d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    bad(
        vars.iter().any(|v| {
            v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"
        }),
        "no `datasource` variable of type datasource (prometheus)".into(),
    );
    for (name, label) in VARIABLES {
        let v = vars.iter().find(|v| v["name"] == *name);
        bad(
            v.is_some_and(|v| {
                v["type"] == "query"
                    && v["includeAll"] == true
                    && v["multi"] == true
                    // `job`'s All is the list of its values (so `up` shows
                    // the agents only); the others' is `.*` (they may be
                    // absent from a target).
                    && (if *name == "job" {
                        v["allValue"].is_null()
                    } else {
                        v["allValue"] == ".*"
                    })
                    && v["datasource"]["uid"] == "${datasource}"
                    && var_query(v).ends_with(&format!(", {label})"))
            }),
            format!(
                "variable {name}: not a multi, includeAll (.*, or no allValue for job) query variable of label {label} on ${{datasource}}"
            ),
        );
    }
    let mut ids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    let all_exprs = vars
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| ("variable".to_string(), var_query(v)))
        .collect::<Vec<_>>();
    let mut exprs = all_exprs;
    for panel in panels(d) {
        let t = panel["title"].as_str().unwrap_or("?").to_string();
        bad(
            ids.insert(panel["id"].to_string()),
            format!("duplicate panel id {}", panel["id"]),
        );
        bad(
            titles.insert(t.clone()),
            format!("duplicate panel title {t:?}"),
        );
        bad(
            panel["datasource"]["uid"] == "${datasource}",
            format!(
                "panel {t:?}: datasource is not ${{datasource}}: {}",
                panel["datasource"]
            ),
        );
        bad(
            panel["description"].is_string(),
            format!("panel {t:?}: no description"),
        );
        let ts = targets(panel);
        // A health panel (`up`): 0 must not look like 1 at 3 a.m. Grafana's
        // default thresholds are green from the start (red from 80).
        if ts
            .iter()
            .any(|t| t["expr"].as_str().is_some_and(|e| e.starts_with("up{")))
        {
            let f = &panel["fieldConfig"]["defaults"];
            let steps = f["thresholds"]["steps"].as_array();
            bad(
                f["color"]["mode"] == "thresholds"
                    && steps.is_some_and(|s| {
                        s.first().is_some_and(|b| b["color"] == "red")
                            && s.iter().any(|x| x["value"] == 1 && x["color"] == "green")
                    }),
                format!("panel {t:?}: up shows 0 in green (thresholds: red base, green at 1)"),
            );
        }
        bad(!ts.is_empty(), format!("panel {t:?}: no queries"));
        for target in ts {
            bad(
                target["datasource"]["uid"] == "${datasource}",
                format!(
                    "panel {t:?} {}: target datasource is not ${{datasource}}",
                    target["refId"]
                ),
            );
            exprs.push((t.clone(), target["expr"].as_str().unwrap_or("").to_string()));
        }
    }
    for (t, e) in &exprs {
        bad(!e.is_empty(), format!("{t:?}: empty expression"));
        // Range selectors: only $__rate_interval, or the whole range shown
        // pinned at its end (a top-k's ranking).
        let mut rest = e.as_str();
        while let Some(i) = rest.find('[') {
            let end = rest[i..].find(']').map(|j| i + j).unwrap_or(rest.len());
            let range = &rest[i..=end.min(rest.len() - 1)];
            let after = &rest[end.min(rest.len() - 1) + 1..];
            bad(
                range == "[$__rate_interval]"
                    || (range == RANKING_RANGE && after.starts_with(PINNED_AT_END)),
                format!(
                    "{t:?}: range {range} is not [$__rate_interval] (nor {RANKING_RANGE}{PINNED_AT_END}) in {e}"
                ),
            );
            rest = after;
        }
        for f in ["rate(", "increase("] {
            for (i, _) in e.match_indices(f) {
                let call = &e[i..];
                let close = call.find(")").unwrap_or(call.len());
                bad(
                    call[..close].contains("[$__rate_interval]")
                        || call[..close].contains(RANKING_RANGE),
                    format!("{t:?}: {f}...) without [$__rate_interval] in {e}"),
                );
            }
        }
        // A top-k in a time series ranks once, over the range shown: at
        // each step of a range query it would pick its own k, and a panel
        // of the "10 biggest" would draw more than 10 lines.
        for (i, _) in e.match_indices("topk(") {
            bad(
                e[i..].contains(PINNED_AT_END) && e[..i].trim_end().ends_with(')'),
                format!(
                    "{t:?}: topk not ranked over the range shown ({RANKING_RANGE}{PINNED_AT_END}, \
                     selecting the series of a rate with `and on (...)`) in {e}"
                ),
            );
        }
        // No hard-coded job (nor any other variable label).
        let mut rest = e.as_str();
        while let Some(i) = rest.find("job") {
            let before_ok = i == 0 || !is_ident(rest.as_bytes()[i - 1]);
            let after = rest[i + 3..].trim_start();
            if before_ok && (after.starts_with('=') || after.starts_with("!")) {
                bad(
                    after.starts_with("=~\"$job\""),
                    format!("{t:?}: hard-coded job matcher in {e}"),
                );
            }
            rest = &rest[i + 3..];
        }
        // Every selector filters by the dashboard's variables.
        let sels = selectors(e);
        bad(
            !sels.is_empty() || t == "variable",
            format!("{t:?}: no metric selector in {e}"),
        );
        let names: BTreeSet<&String> = sels.iter().map(|s| &s.0).collect();
        let pending = names.iter().filter(|n| is_pending(n)).count();
        bad(
            pending == 0 || pending == names.len(),
            format!("{t:?}: mixes pending and exported families in one query: {e}"),
        );
        if t == "variable" {
            continue;
        }
        for (name, matchers) in &sels {
            let mut want = vec![
                r#"job=~"$job""#,
                r#"namespace=~"$namespace""#,
                r#"pod=~"$pod""#,
            ];
            if name.starts_with("pfs_") && !NO_SERVICE.iter().any(|f| name.starts_with(f)) {
                want.push(r#"service=~"$process""#);
            }
            for w in want {
                bad(
                    matchers.contains(w),
                    format!("{t:?}: {name}{{{matchers}}} lacks {w}"),
                );
            }
        }
    }
    p
}

fn var_query(v: &Value) -> String {
    v["query"]["query"]
        .as_str()
        .or(v["query"].as_str())
        .unwrap_or("")
        .to_string()
}

#[test]
fn dashboards_pass_the_lint_rules() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(dashboards_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    let known: BTreeSet<String> = DASHBOARDS.iter().map(|d| d.0.to_string()).collect();
    assert_eq!(on_disk, known, "dashboards on disk differ from DASHBOARDS");
    let readme = std::fs::read_to_string(workspace_root().join("grafana/README.md")).unwrap();
    let mut problems = Vec::new();
    for (file, uid) in DASHBOARDS {
        let d = load(file);
        problems.extend(lint(file, uid, &d));
        for p in panels(&d) {
            let t = p["title"].as_str().unwrap_or("");
            if !readme.contains(&format!("**{t}**")) {
                problems.push(format!(
                    "{file}: panel {t:?} is not explained in grafana/README.md (as **{t}**)"
                ));
            }
        }
        eprintln!(
            "grafana_dashboards: {file}: {} panels, {} queries linted",
            panels(&d).len(),
            panels(&d).iter().map(|p| targets(p).len()).sum::<usize>()
        );
    }
    assert!(
        problems.is_empty(),
        "lint problems:\n{}",
        problems.join("\n")
    );
}

/// A way to break a dashboard.
type Breakage = fn(&mut Value);

/// The "Top waits by time" panel, which the breakages below break (a
/// rate, by service, with every variable).
fn top_waits(d: &mut Value) -> &mut Value {
    d["panels"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["title"] == "Top waits by time")
        .expect("the Top waits by time panel")
}

#[test]
fn lint_rules_can_fail() {
    let (file, uid) = DASHBOARDS[0];
    let good = load(file);
    let cases: [(&str, Breakage); 8] = [
        ("topk not ranked over the range shown", |d| {
            for p in d["panels"].as_array_mut().unwrap() {
                for t in p["targets"].as_array_mut().into_iter().flatten() {
                    let e = t["expr"].as_str().unwrap();
                    if let Some(i) = e.find(" and on (service, event_name) topk(") {
                        let rate = e[..i].to_string();
                        t["expr"] = Value::String(format!("topk(10, {rate})"));
                    }
                }
            }
        }),
        ("not [$__rate_interval]", |d| {
            let e = top_waits(d)["targets"][0]["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m");
            top_waits(d)["targets"][0]["expr"] = Value::String(e);
        }),
        ("hard-coded job", |d| {
            let e = top_waits(d)["targets"][0]["expr"]
                .as_str()
                .unwrap()
                .replace("job=~\"$job\"", "job=\"pfs\"");
            top_waits(d)["targets"][0]["expr"] = Value::String(e);
        }),
        ("datasource is not", |d| {
            top_waits(d)["datasource"] =
                serde_json::json!({"type": "prometheus", "uid": "prometheus"});
        }),
        ("uid is", |d| d["uid"] = Value::String("changed".into())),
        ("up shows 0 in green", |d| {
            for p in d["panels"].as_array_mut().unwrap() {
                if p["title"] == "Targets up" {
                    p["fieldConfig"]["defaults"] = serde_json::json!({"unit": "short"});
                }
            }
        }),
        ("lacks service=~", |d| {
            let e = top_waits(d)["targets"][0]["expr"]
                .as_str()
                .unwrap()
                .replace(", service=~\"$process\"", "");
            top_waits(d)["targets"][0]["expr"] = Value::String(e);
        }),
        ("mixes pending", |d| {
            let e = top_waits(d)["targets"][0]["expr"]
                .as_str()
                .unwrap()
                .to_string();
            top_waits(d)["targets"][0]["expr"] =
                Value::String(format!("{e} + on() pfs_memory_used_bytes{{job=~\"$job\"}}"));
        }),
    ];
    assert!(
        lint(file, uid, &good).is_empty(),
        "the dashboard itself must lint clean"
    );
    // The "mixes pending" rule can only fire while some family is pending.
    for (want, breakage) in cases
        .into_iter()
        .filter(|(want, _)| *want != "mixes pending" || !PENDING.is_empty())
    {
        let mut d = good.clone();
        breakage(&mut d);
        let problems = lint(file, uid, &d);
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "breakage {want:?} went unnoticed: {problems:?}"
        );
    }
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(workspace_root().join(path)).unwrap();
    Value::deserialize(serde_yaml_ng::Deserializer::from_str(&text))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn provisioning_files_are_valid() {
    let ds = yaml("grafana/provisioning/datasources/prometheus.yaml");
    assert_eq!(ds["apiVersion"], 1);
    let d = &ds["datasources"][0];
    assert_eq!(d["type"], "prometheus", "datasource type");
    assert!(
        d["url"].as_str().is_some_and(|u| u.starts_with("http")),
        "datasource url"
    );
    assert!(
        d["jsonData"]["timeInterval"].is_string(),
        "timeInterval (scrape interval) set"
    );
    // Copied into a Grafana that already provisions a default data source
    // (kube-prometheus-stack's, uid `prometheus`), a second default stops
    // Grafana, and the same uid would replace the existing one.
    assert_ne!(d["isDefault"], true, "not the default data source");
    assert_ne!(d["uid"], "prometheus", "a uid of its own");
    let dp = yaml("grafana/provisioning/dashboards/pfs.yaml");
    assert_eq!(dp["apiVersion"], 1);
    let p = &dp["providers"][0];
    assert_eq!(p["type"], "file", "dashboard provider type");
    assert!(
        p["options"]["path"]
            .as_str()
            .is_some_and(|s| s.starts_with('/')),
        "provider path"
    );
}

fn prometheus_on_path() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    })
}

/// An instant query's result vector.
fn query(base: &str, q: &str) -> Vec<Value> {
    pfs_tests::prom_query(base, q).unwrap_or_else(|e| panic!("query {q}: {e:#}"))
}

/// `label_values(metric{...}, label)` as Grafana runs it: the label's
/// values over the series the selector matches.
fn label_values(base: &str, q: &str) -> BTreeSet<String> {
    let inner = q
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not label_values(): {q}"));
    let (sel, label) = inner.rsplit_once(',').unwrap();
    let v = get_json(&format!(
        "{base}/api/v1/series?match[]={}",
        pfs_tests::url_encode(sel.trim())
    ))
    .unwrap_or_else(|e| panic!("series {sel}: {e:#}"));
    v["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s[label.trim()].as_str().map(str::to_string))
        .collect()
}

/// deploy/prometheus/pfs-alerts.rules.yaml in a real Prometheus scraping
/// the demo: every rule evaluates without error, every metric it names is
/// exported (a misspelt name would keep an alert silent forever), and none
/// fires or is pending on this healthy demo.
fn alert_rules_hold(base: &str, failures: &mut Vec<String>) {
    let rules = get_json(&format!("{base}/api/v1/rules")).unwrap();
    let rules: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    let file = std::fs::read_to_string(
        pfs_tests::workspace_root().join("deploy/prometheus/pfs-alerts.rules.yaml"),
    )
    .unwrap();
    let expected = file.matches("- alert: ").count();
    if rules.len() != expected || expected == 0 {
        failures.push(format!(
            "alert rules loaded: {} ({expected} in the rule file)",
            rules.len()
        ));
    }
    for r in rules {
        let name = r["name"].as_str().unwrap_or("?");
        if r["health"] != "ok" {
            failures.push(format!(
                "alert {name}: health {} {}",
                r["health"], r["lastError"]
            ));
        }
        if r["state"] != "inactive" {
            failures.push(format!("alert {name} is {} on a healthy demo", r["state"]));
        }
        let expr = r["query"].as_str().unwrap_or_default();
        // Metric names: `pfs_*` and `up` words, less label names (a word
        // followed by a matcher: `=`, `!=`, `=~`).
        let mut names = BTreeSet::new();
        let mut rest = expr;
        while let Some(start) = rest.find(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            let word_len = rest[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len() - start);
            let word = &rest[start..start + word_len];
            rest = &rest[start + word_len..];
            let label = rest.trim_start().starts_with(['=', '!']);
            if (word.starts_with("pfs_") || word == "up") && !label {
                names.insert(word);
            }
        }
        for m in names {
            if query(base, &format!("count({m})")).is_empty() {
                failures.push(format!("alert {name}: no series of {m}"));
            }
        }
    }
}

/// Substitutes template variables as Grafana does for Prometheus: `All`
/// becomes the variable's allValue (`.*`), a single value is itself.
fn substitute(expr: &str, vars: &BTreeMap<&str, &str>) -> String {
    let mut e = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__range", RANGE);
    // Longest names first ($process before $pod is not an issue, but keep
    // it general).
    let mut names: Vec<&&str> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        e = e
            .replace(&format!("${{{n}}}"), vars[*n])
            .replace(&format!("${n}"), vars[*n]);
    }
    assert!(!e.contains('$'), "unsubstituted variable in {e}");
    e
}

/// The k of an expression's `topk(k, ...)`, if it has one.
fn topk_of(expr: &str) -> Option<usize> {
    let i = expr.find("topk(")? + "topk(".len();
    expr[i..].split(',').next()?.trim().parse().ok()
}

fn finite_values(res: &[Value]) -> usize {
    res.iter()
        .filter(|r| {
            r["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        })
        .count()
}

/// Stops `pfs-agent demo` with SIGTERM (even when the test fails), so it
/// stops its workload child too; ChildGuard's SIGKILL would orphan it.
struct Graceful(ChildGuard);

impl Drop for Graceful {
    fn drop(&mut self) {
        if self.0.try_wait().is_none() {
            self.0.signal(libc::SIGTERM);
            self.0.wait_timeout(Duration::from_secs(10));
        }
    }
}

#[test]
fn every_panel_query_returns_data_from_a_real_prometheus() {
    let Some(_) = prometheus_on_path() else {
        panic!(
            "the `prometheus` binary is not on PATH; run scripts/test (apt-get install prometheus)"
        );
    };
    let started = Instant::now();
    let shm = tempfile::tempdir().unwrap();
    let tsdb = tempfile::tempdir().unwrap();
    let port = free_port();
    // OTLP push on, to a real receiver, as a deployment with a collector
    // has it: the OTLP panel and alert have their series.
    let otlp_port = free_port();
    let _receiver = OtlpReceiver::start(None, Some(otlp_port))
        .unwrap_or_else(|e| panic!("OTLP receiver: {e:#}"));
    let mut cmd = Command::new(agent_bin());
    cmd.arg("demo")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--shm-dir")
        .arg(shm.path())
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{otlp_port}"))
        .arg("--otlp-interval")
        .arg("1s");
    let mut demo = Graceful(ChildGuard::spawn("pfs-agent-demo", cmd, false).unwrap());
    let demo = &mut demo.0;
    wait_healthz(
        &format!("http://127.0.0.1:{port}"),
        demo,
        Duration::from_secs(20),
    )
    .unwrap();
    // A healthy directory (no refused file): every panel must still show
    // data, the segment-error panels included (every reason is exported
    // at 0 from the start).

    // Prometheus scraping every second, with the target labels a
    // PodMonitor would add.
    let prom_port = free_port();
    let rules = workspace_root().join("deploy/prometheus/pfs-alerts.rules.yaml");
    let rules = rules.display();
    let config = tsdb.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: pfs\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
             static_configs:\n      - targets: ['127.0.0.1:{port}']\n        \
             labels:\n          namespace: pfs-e2e\n          pod: kvstore-demo-0\n\
             \x20 - job_name: prometheus\n    static_configs:\n      - targets: ['127.0.0.1:{prom_port}']\n"
        ),
    )
    .unwrap();
    let prom = pfs_tests::start_prometheus(&config, &tsdb.path().join("data"), prom_port)
        .unwrap_or_else(|e| panic!("prometheus not ready: {e:#}"));
    let base = format!("http://127.0.0.1:{prom_port}");
    // The same, ingesting native histograms (protobuf scrapes): every
    // panel must show data with either kind of histogram.
    let native_port = free_port();
    let native_prom = pfs_tests::start_prometheus_with(
        &config,
        &tsdb.path().join("native"),
        native_port,
        &["--enable-feature=native-histograms"],
    )
    .unwrap_or_else(|e| panic!("native-histogram prometheus not ready: {e:#}"));
    let native_base = format!("http://127.0.0.1:{native_port}");
    for (b, p) in [(&base, &prom), (&native_base, &native_prom)] {
        poll(Duration::from_secs(20), || {
            Ok((!query(b, "pfs_agent_build_info").is_empty()).then_some(()))
        })
        .unwrap_or_else(|e| {
            panic!(
                "no first scrape: {e:#}\n{}\n{}",
                p.describe(),
                demo.describe()
            )
        });
    }
    // Let the rate windows fill: more than RATE_INTERVAL of 1 s scrapes.
    let first = Instant::now();
    std::thread::sleep(Duration::from_secs(18).saturating_sub(first.elapsed()));

    // Prometheus also scrapes itself (job `prometheus`), as any real one
    // does: no panel may show that job when All is selected. Grafana's
    // All for `job` (no allValue) is the regex of the variable's values.
    let jobs: Vec<String> = label_values(&base, "label_values(pfs_agent_build_info, job)")
        .into_iter()
        .collect();
    assert_eq!(
        jobs,
        ["pfs"],
        "the job variable lists the agents' jobs only"
    );
    let all_jobs = format!("({})", jobs.join("|"));
    let all: BTreeMap<&str, &str> = VARIABLES
        .iter()
        .map(|v| {
            (
                v.0,
                if v.0 == "job" {
                    all_jobs.as_str()
                } else {
                    ".*"
                },
            )
        })
        .chain([("instrument", ".*")])
        .collect();
    let one: BTreeMap<&str, &str> = [
        ("job", "pfs"),
        ("namespace", "pfs-e2e"),
        ("pod", "kvstore-demo-0"),
        ("process", "kvstore-demo"),
        ("instrument", ".*"),
    ]
    .into();
    let mut failures = Vec::new();
    alert_rules_hold(&base, &mut failures);
    let mut counts = (0, 0);
    for (kind, base) in [("classic", &base), ("native", &native_base)] {
        let before = failures.len();
        for (file, _) in DASHBOARDS {
            let d = load(file);
            // Variables: each query returns the values Prometheus has.
            for v in d["templating"]["list"].as_array().unwrap() {
                if v["type"] != "query" {
                    continue;
                }
                let name = v["name"].as_str().unwrap();
                let q = substitute(&var_query(v), &all);
                let vals = label_values(base, &q);
                let pending = only_pending(&q);
                eprintln!(
                    "grafana_dashboards: variable ${name}: {vals:?}{}",
                    if pending { " (pending)" } else { "" }
                );
                let want: Option<&str> = one.get(name).copied().filter(|w| *w != ".*");
                match (pending, want) {
                (true, _) if !vals.is_empty() => failures.push(format!(
                    "variable ${name} uses a PENDING family but returned {vals:?}: remove it from PENDING"
                )),
                (false, Some(w)) if !vals.contains(w) => {
                    failures.push(format!("variable ${name}: {vals:?} lacks {w}"))
                }
                _ => {}
            }
            }
            for panel in panels(&d) {
                let title = panel["title"].as_str().unwrap();
                for t in targets(panel) {
                    let expr = t["expr"].as_str().unwrap();
                    let pending = only_pending(expr);
                    let q_all = substitute(expr, &all);
                    let res = query(base, &q_all);
                    let finite = finite_values(&res);
                    let res_one = query(base, &substitute(expr, &one));
                    // A value no series has: the query must select nothing,
                    // which proves it honours the variable.
                    let mut none = one.clone();
                    none.insert("pod", "no-such-pod");
                    let res_none = query(base, &substitute(expr, &none));
                    eprintln!(
                        "grafana_dashboards: [{}] {title} / {}: {} series ({finite} finite), {} with single values, {} with an unknown pod",
                        if pending { "pending" } else { "live" },
                        t["refId"].as_str().unwrap_or("?"),
                        res.len(),
                        res_one.len(),
                        res_none.len(),
                    );
                    if pending {
                        counts.1 += 1;
                        if !res.is_empty() {
                            failures.push(format!(
                            "{title} / {}: uses only PENDING families but now returns {} series: \
                             the family exists, remove it from PENDING ({q_all})",
                            t["refId"],
                            res.len()
                        ));
                        }
                    } else {
                        counts.0 += 1;
                        if finite == 0 {
                            failures.push(format!(
                                "{title} / {}: no data for All: {q_all} -> {res:?}",
                                t["refId"]
                            ));
                        }
                        if finite_values(&res_one) == 0 {
                            failures.push(format!(
                                "{title} / {}: no data with single values selected",
                                t["refId"]
                            ));
                        }
                    }
                    if let Some(k) = topk_of(expr) {
                        // As Grafana draws it: every step of a range query.
                        let drawn = pfs_tests::prom_query_range(
                            base,
                            &q_all,
                            Duration::from_secs(15),
                            Duration::from_secs(1),
                        )
                        .unwrap_or_else(|e| panic!("{title}: {e:#}"));
                        let ranked = expr.split(" and on ").next().unwrap_or(expr);
                        let candidates = query(base, &substitute(ranked, &all)).len();
                        eprintln!(
                            "grafana_dashboards: {title}: {} lines drawn over 15 s, top {k} of {candidates}",
                            drawn.len()
                        );
                        if candidates <= k {
                            failures.push(format!(
                                "{title}: the demo has {candidates} series to rank, not more than {k}: this check of the top {k} proves nothing"
                            ));
                        }
                        if drawn.len() > k {
                            failures.push(format!(
                                "{title} / {}: a top {k} draws {} lines over a range: {q_all}",
                                t["refId"],
                                drawn.len()
                            ));
                        }
                    }
                    let foreign: Vec<&str> = res
                        .iter()
                        .filter_map(|r| r["metric"]["job"].as_str())
                        .filter(|j| !jobs.iter().any(|a| a == j))
                        .collect();
                    if !foreign.is_empty() {
                        failures.push(format!(
                            "{title} / {}: shows jobs without an agent for All: {foreign:?}",
                            t["refId"]
                        ));
                    }
                    if !res_none.is_empty() {
                        failures.push(format!(
                            "{title} / {}: ignores $pod ({} series for an unknown pod)",
                            t["refId"],
                            res_none.len()
                        ));
                    }
                }
            }
        }
        for f in &mut failures[before..] {
            *f = format!("[{kind} histograms] {f}");
        }
    }
    eprintln!(
        "grafana_dashboards: {} live queries with data, {} pending queries empty, in {:.1?}",
        counts.0,
        counts.1,
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        demo.describe()
    );
    drop((prom, native_prom));
}
