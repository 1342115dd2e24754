//! deploy/prometheus/pfs-alerts.rules.yaml (and the optional
//! pfs-slo-alerts.rules.yaml): a valid rule file
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

/// What `promtool check` says of rule file `name`: as many rules as it
/// has `- alert:` entries.
fn rules_found(name: &str) -> String {
    let file =
        std::fs::read_to_string(workspace_root().join("deploy/prometheus").join(name)).unwrap();
    format!("SUCCESS: {} rules found", file.matches("- alert: ").count())
}

#[test]
fn the_alert_rules_are_valid_and_their_unit_tests_pass() {
    let checked = promtool(&["check", "rules", "pfs-alerts.rules.yaml"]);
    assert!(
        checked.contains(&rules_found("pfs-alerts.rules.yaml")),
        "{checked}"
    );
    let tested = promtool(&["test", "rules", "pfs-alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The optional templates (slow requests, slow I/O, a contended lock,
/// growing memory): valid, and firing or quiet as their tests say.
#[test]
fn the_optional_slo_rules_are_valid_and_their_unit_tests_pass() {
    let name = "pfs-slo-alerts.rules.yaml";
    let checked = promtool(&["check", "rules", name]);
    assert!(checked.contains(&rules_found(name)), "{checked}");
    assert!(rules_found(name).contains(" 4 rules"), "{checked}");
    let tested = promtool(&["test", "rules", "pfs-slo-alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The annotation job's relabelling, run by a real Prometheus on pods
/// described as Kubernetes discovery describes them (file discovery
/// carrying the same `__meta_kubernetes_*` labels, which Debian's
/// Prometheus can read): of a pod with the agent as a native sidecar, only
/// the agent's `metrics` port is scraped, labelled for the dashboard and
/// the alert rules; the app's own port, a pod that did not ask, and an
/// evicted pod are dropped.
#[test]
fn the_annotation_scrape_job_keeps_only_the_agents_port() {
    let dir = workspace_root().join("deploy/prometheus");
    let text = std::fs::read_to_string(dir.join("scrape-annotations.yaml")).unwrap();
    let sd = "    kubernetes_sd_configs:\n      - role: pod\n";
    let tmp = tempfile::tempdir().unwrap();
    let targets = tmp.path().join("pods.json");
    std::fs::write(
        tmp.path().join("prometheus.yml"),
        text.replace(
            sd,
            &format!(
                "    file_sd_configs:\n      - files: [\"{}\"]\n",
                targets.display()
            ),
        ),
    )
    .unwrap();
    std::fs::copy(
        dir.join("pfs-alerts.rules.yaml"),
        tmp.path().join("pfs-alerts.rules.yaml"),
    )
    .unwrap();
    // One target per container port, as the pod role makes them.
    let pod = |name: &str,
               phase: &str,
               scrape: Option<&str>,
               container: &str,
               port: &str,
               init: bool| {
        let mut labels = serde_json::json!({
            "__meta_kubernetes_namespace": "shop",
            "__meta_kubernetes_pod_name": name,
            "__meta_kubernetes_pod_node_name": "node-1",
            "__meta_kubernetes_pod_phase": phase,
            "__meta_kubernetes_pod_container_name": container,
            "__meta_kubernetes_pod_container_port_name": port,
            "__meta_kubernetes_pod_container_init": init.to_string(),
            // The application's own metrics, as an existing pod has them
            // (a pod has one set of annotations): the agent's target is
            // still scraped at its /metrics.
            "__meta_kubernetes_pod_annotation_prometheus_io_path": "/actuator/prometheus",
            "__meta_kubernetes_pod_annotation_prometheus_io_port": "8080",
        });
        if let Some(v) = scrape {
            labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] = v.into();
        }
        let port_number = if port == "metrics" { 9464 } else { 8080 };
        serde_json::json!({"targets": [format!("127.0.0.{}:{port_number}", name.len())], "labels": labels})
    };
    let groups = serde_json::json!([
        pod(
            "app-1",
            "Running",
            Some("true"),
            "pfs-agent",
            "metrics",
            true
        ),
        pod("app-1", "Running", Some("true"), "app", "http", false),
        pod("other", "Running", None, "pfs-agent", "metrics", true),
        pod(
            "evicted-1",
            "Failed",
            Some("true"),
            "pfs-agent",
            "metrics",
            true
        ),
    ]);
    std::fs::write(&targets, serde_json::to_vec(&groups).unwrap()).unwrap();
    let port = pfs_tests::free_port();
    let data = tmp.path().join("data");
    let _prom =
        pfs_tests::start_prometheus(&tmp.path().join("prometheus.yml"), &data, port).unwrap();
    let url = format!("http://127.0.0.1:{port}/api/v1/targets");
    let (active, dropped) = pfs_tests::poll(std::time::Duration::from_secs(30), || {
        let body: serde_json::Value = serde_json::from_str(&pfs_tests::http_get(&url)?.body)?;
        let active = body["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let dropped = body["data"]["droppedTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok((active.len() + dropped.len() == 4).then_some((active, dropped)))
    })
    .unwrap();
    assert_eq!(active.len(), 1, "one target: {active:#?}");
    assert_eq!(dropped.len(), 3);
    let labels = &active[0]["labels"];
    let want = serde_json::json!({
        "instance": "127.0.0.5:9464",
        "job": "pfs-agents",
        "namespace": "shop",
        "node": "node-1",
        "pfs_agent": "true",
        "pod": "app-1",
    });
    assert_eq!(labels, &want);
    assert_eq!(active[0]["scrapeUrl"], "http://127.0.0.5:9464/metrics");
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
    assert!(
        text.contains(&rules_found("pfs-alerts.rules.yaml")),
        "{text}"
    );
}
