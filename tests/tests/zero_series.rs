//! Series that exist before their first event (the Prometheus
//! instrumentation guide's "avoid missing metrics"): a real agent over a
//! healthy directory exports every `reason` of
//! `pfs_agent_segment_errors_total` and, for each service, every `kind` of
//! `pfs_lost_total`, at 0, so dashboards show 0 rather than "No data" and
//! `increase()` sees the first error. The label values come from the
//! enums the agent counts with (`Refusal::ALL`, `LostKind::ALL`).

use std::collections::BTreeMap;
use std::time::Duration;

use pfs_agent::segments::Refusal;
use pfs_shm_layout::layout::LostKind;
use pfs_tests::{Agent, Sample, poll, spawn_exact, writer_exe};

const ERRORS: &str = "pfs_agent_segment_errors_total";
const LOST: &str = "pfs_lost_total";

/// The samples of `name`, by the value of `label`.
fn by_label<'a>(m: &'a [Sample], name: &str, label: &str) -> Vec<(&'a str, f64)> {
    m.iter()
        .filter(|s| s.name == name)
        .map(|s| (s.labels[label].as_str(), s.value))
        .collect()
}

#[test]
fn every_reason_and_kind_is_exported_at_zero_on_a_healthy_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (_w, _) = spawn_exact(writer_exe!(), dir.path(), "zs", 2, 10, 0).unwrap();
    let agent = Agent::serve(dir.path()).unwrap();
    let m = poll(Duration::from_secs(20), || {
        let m = agent.metrics()?;
        Ok(m.iter()
            .any(|s| s.name == "pfs_events_waits_total" && s.has_labels(&[("service", "zs")]))
            .then_some(m))
    })
    .unwrap_or_else(|e| panic!("the writer's segment is never exported: {e:#}"));

    let errors: BTreeMap<&str, f64> = by_label(&m, ERRORS, "reason").into_iter().collect();
    let want: BTreeMap<&str, f64> = Refusal::ALL.iter().map(|r| (r.label(), 0.0)).collect();
    assert_eq!(errors, want, "every refusal reason at 0, and no other");

    let lost: Vec<(&str, f64)> = m
        .iter()
        .filter(|s| s.name == LOST && s.has_labels(&[("service", "zs")]))
        .map(|s| (s.labels["kind"].as_str(), s.value))
        .collect();
    for k in LostKind::ALL {
        assert!(
            lost.contains(&(k.name(), 0.0)),
            "{LOST}{{service=\"zs\",kind=\"{}\"}} is not 0: {lost:?}",
            k.name()
        );
    }
    assert_eq!(lost.len(), LostKind::ALL.len(), "{lost:?}");
}

#[test]
fn reasons_exist_before_any_segment_and_count_from_zero() {
    // No process yet: the agent's own series are there already.
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::serve(dir.path()).unwrap();
    let m = agent.metrics().unwrap();
    let errors = by_label(&m, ERRORS, "reason");
    assert_eq!(errors.len(), Refusal::ALL.len(), "{errors:?}");
    assert!(errors.iter().all(|(_, v)| *v == 0.0), "{errors:?}");

    // The first refused file moves its own series from 0 to 1; the others
    // stay at 0.
    std::fs::write(dir.path().join("garbage.1.pfs"), vec![0x5a; 4096]).unwrap();
    let m = poll(Duration::from_secs(20), || {
        let m = agent.metrics()?;
        Ok(m.iter()
            .any(|s| s.name == ERRORS && s.has_labels(&[("reason", "bad_magic")]) && s.value == 1.0)
            .then_some(m))
    })
    .unwrap_or_else(|e| panic!("bad_magic never counted: {e:#}"));
    for (reason, v) in by_label(&m, ERRORS, "reason") {
        let want = if reason == "bad_magic" { 1.0 } else { 0.0 };
        assert_eq!(v, want, "{reason}");
    }
}
