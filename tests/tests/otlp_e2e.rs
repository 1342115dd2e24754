//! OTLP push end to end, against a receiver that is not our code
//! (`tests/otlp_receiver.py`: the official OpenTelemetry protobuf classes
//! and grpcio): exact counts from `pfs-test-writer exact`, our histogram
//! bounds, resources and units, over gRPC and HTTP/protobuf; and a
//! collector that is down when the agent starts.

use std::time::{Duration, Instant};

use pfs_shm_layout::layout::{HISTOGRAM_BUCKETS, bucket_upper_seconds};
use pfs_tests::{
    Agent, OtlpReceiver, TEST_CLASSES, free_port, otlp_metrics, poll, sample, spawn_exact,
    writer_exe,
};
use serde_json::Value;

const N: u64 = 4;
const K: u64 = 500;
const M: u64 = 2;

fn our_bounds() -> Vec<f64> {
    (0..HISTOGRAM_BUCKETS)
        .filter_map(bucket_upper_seconds)
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
}

/// The point of `metric` whose `event_name` attribute is `name`.
fn point<'a>(metric: &'a Value, name: &str) -> Option<&'a Value> {
    metric["points"]
        .as_array()?
        .iter()
        .find(|p| p["attributes"]["event_name"] == name)
}

/// Whether `req` carries the writer's final counts for every test class.
fn complete(req: &Value) -> bool {
    otlp_metrics(req, "pfs.events.waits").iter().any(|(_, m)| {
        TEST_CLASSES
            .iter()
            .all(|c| point(m, c).is_some_and(|p| p["value"] == N * K))
    })
}

fn run_transport(grpc: bool) {
    let service = if grpc {
        "otlp-e2e-grpc"
    } else {
        "otlp-e2e-http"
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, ready) = spawn_exact(
        writer_exe!(),
        dir.path(),
        service,
        N as u32,
        K as u32,
        M as u32,
    )
    .unwrap();
    let port = free_port();
    let mut receiver = if grpc {
        OtlpReceiver::start(Some(port), None)
    } else {
        OtlpReceiver::start(None, Some(port))
    }
    .unwrap();
    let mut env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            if grpc { "grpc" } else { "http/protobuf" }.to_string(),
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "1000".to_string()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-test-token=abc".to_string()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=e2e".to_string(),
        ),
        ("K8S_POD_NAME", "pod-7".to_string()),
        ("K8S_NAMESPACE", "ns-e2e".to_string()),
    ];
    if grpc {
        // One forced resource; the `service` attribute stays on points.
        env.push(("OTEL_SERVICE_NAME", "forced-name".to_string()));
    } else {
        // One resource per service, gzip bodies.
        env.push(("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip".to_string()));
    }
    let agent = Agent::serve_with_env(dir.path(), &env).unwrap();

    let req = receiver
        .wait_for(Duration::from_secs(20), complete)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.describe()));
    assert_eq!(req["transport"], if grpc { "grpc" } else { "http" });
    assert_eq!(
        req["headers"]["x-test-token"], "abc",
        "OTEL_EXPORTER_OTLP_HEADERS"
    );

    // --- pfs.events.waits: cumulative monotonic sums, exact counts ---------
    let waits = otlp_metrics(&req, "pfs.events.waits");
    let (resource, m) = waits
        .iter()
        .find(|(_, m)| point(m, TEST_CLASSES[0]).is_some())
        .copied()
        .unwrap();
    assert_eq!(m["type"], "sum", "{m}");
    assert_eq!(m["temporality"], "cumulative");
    assert_eq!(m["is_monotonic"], true);
    assert_eq!(m["unit"], "{event}");
    for c in TEST_CLASSES {
        let p = point(m, c).unwrap();
        assert_eq!(p["value"], N * K, "{c}");
        assert!(p["start"].as_u64().unwrap() < p["time"].as_u64().unwrap());
        if grpc {
            assert_eq!(p["attributes"]["service"], service, "{p}");
        } else {
            assert!(p["attributes"].get("service").is_none(), "{p}");
        }
    }

    // --- resource ------------------------------------------------------------
    let want_name = if grpc { "forced-name" } else { service };
    assert_eq!(resource["service.name"], want_name, "{resource}");
    assert_eq!(resource["process.pid"], agent.guard.pid(), "{resource}");
    assert_eq!(resource["service.instance.id"], "ns-e2e.pod-7");
    assert_eq!(resource["k8s.pod.name"], "pod-7");
    assert_eq!(resource["k8s.namespace.name"], "ns-e2e");
    assert_eq!(resource["deployment.environment"], "e2e");
    assert!(
        resource["host.name"]
            .as_str()
            .is_some_and(|h| !h.is_empty())
    );
    let resources: Vec<&Value> = req["resource_metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["resource"]["service.name"])
        .collect();
    if grpc {
        assert_eq!(resources, [&Value::from("forced-name")]);
    } else {
        // The writer's service, and the agent's own metrics.
        assert!(resources.contains(&&Value::from(service)), "{resources:?}");
        assert!(
            resources.contains(&&Value::from("pfs-agent")),
            "{resources:?}"
        );
        let (r, _) = otlp_metrics(&req, "pfs.agent.snapshots")[0];
        assert_eq!(r["service.name"], "pfs-agent");
    }

    // --- seconds and histograms -------------------------------------------------
    let (_, secs) = otlp_metrics(&req, "pfs.events.waits.seconds")
        .into_iter()
        .find(|(_, m)| point(m, TEST_CLASSES[0]).is_some())
        .unwrap();
    assert_eq!(secs["unit"], "s");
    assert_eq!(secs["is_monotonic"], true);
    let (_, hist) = otlp_metrics(&req, "pfs.events.waits.duration")
        .into_iter()
        .find(|(_, m)| point(m, TEST_CLASSES[0]).is_some())
        .unwrap();
    assert_eq!(hist["type"], "histogram");
    assert_eq!(hist["unit"], "s");
    assert_eq!(hist["temporality"], "cumulative");
    let bounds = our_bounds();
    for c in TEST_CLASSES {
        let want_secs = ready["classes"][c]["sum_ps"].as_u64().unwrap() as f64 / 1e12;
        let s = point(secs, c).unwrap()["value"].as_f64().unwrap();
        assert!(close(s, want_secs), "{c} seconds {s} vs {want_secs}");
        let p = point(hist, c).unwrap();
        assert_eq!(p["count"], N * K, "{c}: {p}");
        let sum = p["sum"].as_f64().unwrap();
        assert!(
            close(sum, want_secs),
            "{c} histogram sum {sum} vs {want_secs}"
        );
        let got: Vec<f64> = p["explicit_bounds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_f64().unwrap())
            .collect();
        assert_eq!(got.len(), bounds.len(), "{c}: bounds {got:?}");
        assert!(
            got.iter().zip(&bounds).all(|(a, b)| close(*a, *b)),
            "{c}: bounds {got:?} vs {bounds:?}"
        );
        let counts: Vec<u64> = p["bucket_counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(counts.len(), bounds.len() + 1);
        assert_eq!(counts.iter().sum::<u64>(), N * K, "{c}: {counts:?}");
    }

    // --- the same buckets as /metrics -----------------------------------------------
    let metrics = agent.metrics().unwrap();
    let c = TEST_CLASSES[0];
    let p = point(hist, c).unwrap();
    let mut cumulative = 0;
    for (b, n) in bounds.iter().zip(p["bucket_counts"].as_array().unwrap()) {
        cumulative += n.as_u64().unwrap();
        let le = metrics
            .iter()
            .find(|s| {
                s.name == "pfs_events_waits_duration_seconds_bucket"
                    && s.has_labels(&[("service", service), ("event_name", c)])
                    && s.labels["le"].parse::<f64>().is_ok_and(|l| close(l, *b))
            })
            .unwrap_or_else(|| panic!("/metrics has no bucket le={b}"));
        assert_eq!(le.value, cumulative as f64, "le={b}");
    }

    // --- exports are counted ------------------------------------------------------------
    let ok = poll(Duration::from_secs(10), || {
        let m = agent.metrics()?;
        let v = sample(&m, "pfs_agent_otlp_exports_total", &[("result", "success")])?;
        Ok((v > 0.0).then_some(v))
    })
    .unwrap();
    assert!(ok >= 1.0);
    let exported = receiver
        .wait_for(Duration::from_secs(10), |r| {
            !otlp_metrics(r, "pfs.agent.otlp.exports").is_empty()
        })
        .unwrap();
    let (_, e) = otlp_metrics(&exported, "pfs.agent.otlp.exports")[0];
    assert_eq!(e["unit"], "{export}");
    writer.finish(Duration::from_secs(10)).unwrap();
}

#[test]
fn otlp_grpc_exports_exact_counts_and_histograms() {
    run_transport(true);
}

#[test]
fn otlp_http_protobuf_exports_exact_counts_and_histograms() {
    run_transport(false);
}

#[test]
fn otlp_collector_down_at_start_does_not_block_metrics_and_recovers() {
    let service = "otlp-e2e-outage";
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, _ready) = spawn_exact(writer_exe!(), dir.path(), service, 2, 100, 0).unwrap();
    let port = free_port(); // nothing listens here yet
    let agent = Agent::serve_with_env(
        dir.path(),
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{port}"),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000".to_string()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000".to_string()),
            ("OTEL_SERVICE_NAME", "outage".to_string()),
        ],
    )
    .unwrap();

    // During the outage /metrics answers promptly, every time.
    let outage = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut failures = 0.0;
    while outage.elapsed() < Duration::from_secs(4) || failures == 0.0 {
        assert!(
            outage.elapsed() < Duration::from_secs(15),
            "no failed export counted during the outage\n{}",
            agent.guard.describe()
        );
        let t = Instant::now();
        let m = agent.metrics().unwrap();
        let took = t.elapsed();
        slowest = slowest.max(took);
        assert!(took < Duration::from_secs(1), "/metrics took {took:?}");
        failures = sample(&m, "pfs_agent_otlp_exports_total", &[("result", "failure")]).unwrap();
        assert_eq!(
            sample(&m, "pfs_agent_otlp_exports_total", &[("result", "success")]).unwrap(),
            0.0
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    eprintln!("outage: {failures} failed exports, slowest /metrics {slowest:?}");

    // The collector comes up: exports flow again within the back-off.
    let up = Instant::now();
    let mut receiver = OtlpReceiver::start(Some(port), None).unwrap();
    let req = receiver
        .wait_for(Duration::from_secs(20), |r| {
            otlp_metrics(r, "pfs.events.waits")
                .iter()
                .any(|(_, m)| point(m, TEST_CLASSES[0]).is_some_and(|p| p["value"] == 2 * 100))
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.describe()));
    eprintln!(
        "first export {:?} after the collector came up",
        up.elapsed()
    );
    let (res, _) = otlp_metrics(&req, "pfs.events.waits")[0];
    assert_eq!(res["service.name"], "outage");
    let ok = poll(Duration::from_secs(10), || {
        let m = agent.metrics()?;
        let v = sample(&m, "pfs_agent_otlp_exports_total", &[("result", "success")])?;
        Ok((v > 0.0).then_some(v))
    })
    .unwrap();
    assert!(ok >= 1.0);
    // The error is logged on state changes, not on every failed cycle.
    let log = agent.guard.stderr();
    let warned = log.matches("OTLP export failed").count();
    assert!(
        (1..=3).contains(&warned),
        "{warned} failure log lines for {failures} failures:\n{log}"
    );
    assert!(log.contains("OTLP export recovered"), "{log}");
    writer.finish(Duration::from_secs(10)).unwrap();
}
