//! deploy/prometheus/pfs-alerts.rules.yaml: a valid rule file
//! (`promtool check rules`) whose alerts fire, and stay quiet, as its unit
//! tests say (`promtool test rules pfs-alerts.test.yaml`). That every
//! metric the rules use is exported, and that a real Prometheus evaluates
//! them against a real agent without error and with no alert on a healthy
//! demo, is checked in grafana_dashboards.rs, which runs that Prometheus.
//! deploy/prometheus/scrape-annotations.yaml, the scrape job of the base
//! deployment, passes `promtool check config`.

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

#[test]
fn the_annotation_scrape_config_is_valid() {
    // Debian's Prometheus has no Kubernetes discovery: a static target
    // stands in for it; the relabelling, the rule file and the rest are
    // checked as shipped.
    let dir = workspace_root().join("deploy/prometheus");
    let text = std::fs::read_to_string(dir.join("scrape-annotations.yaml")).unwrap();
    let sd = "    kubernetes_sd_configs:\n      - role: pod\n";
    assert!(text.contains(sd), "the job discovers pods");
    assert!(
        !text.contains("target_label: service"),
        "no `service` target label: it would rename the agent's"
    );
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("scrape.yaml"),
        text.replace(
            sd,
            "    static_configs:\n      - targets: [\"127.0.0.1:9464\"]\n",
        ),
    )
    .unwrap();
    std::fs::copy(
        dir.join("pfs-alerts.rules.yaml"),
        tmp.path().join("pfs-alerts.rules.yaml"),
    )
    .unwrap();
    let out = Command::new("promtool")
        .args(["check", "config", "scrape.yaml"])
        .current_dir(tmp.path())
        .output()
        .expect("promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check config:\n{text}");
    assert!(text.contains("SUCCESS: 5 rules found"), "{text}");
}
