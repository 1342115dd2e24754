//! deploy/prometheus/pfs-alerts.rules.yaml: a valid rule file
//! (`promtool check rules`) whose alerts fire, and stay quiet, as its unit
//! tests say (`promtool test rules pfs-alerts.test.yaml`). That every
//! metric the rules use is exported, and that a real Prometheus evaluates
//! them against a real agent without error and with no alert on a healthy
//! demo, is checked in grafana_dashboards.rs, which runs that Prometheus.

use std::process::Command;

use pfs_tests::workspace_root;

fn promtool(args: &[&str]) -> String {
    let dir = workspace_root().join("deploy/prometheus");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(&dir)
        .output()
        .expect("promtool (installed with Debian's prometheus package, see scripts/test)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_are_valid_and_their_unit_tests_pass() {
    let checked = promtool(&["check", "rules", "pfs-alerts.rules.yaml"]);
    assert!(checked.contains("SUCCESS: 5 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "pfs-alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}
