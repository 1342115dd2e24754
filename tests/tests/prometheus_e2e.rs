//! End to end with a real Prometheus: `pfs-agent demo` (agent + an
//! instrumented key-value-store child) is scraped every second, and
//! Prometheus must see the kvstore instruments and a positive rate.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pfs_tests::{ChildGuard, agent_bin, free_port, poll, wait_healthz};
use serde_json::Value;

fn prometheus_on_path() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    })
}

/// `result` of a Prometheus instant query.
fn query(base: &str, q: &str) -> anyhow::Result<Vec<Value>> {
    pfs_tests::prom_query(base, q)
}

fn pfs_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".pfs"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn prometheus_scrapes_the_demo() {
    let Some(_) = prometheus_on_path() else {
        panic!(
            "the `prometheus` binary is not on PATH; run scripts/test, which installs it \
             (apt-get install prometheus), or install it yourself"
        );
    };
    let shm = tempfile::tempdir().unwrap();
    let tsdb = tempfile::tempdir().unwrap();

    // The demo: agent + instrumented kvstore child.
    let port = free_port();
    let mut cmd = Command::new(agent_bin());
    cmd.arg("demo")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--shm-dir")
        .arg(shm.path());
    let mut demo = ChildGuard::spawn("pfs-agent-demo", cmd, false).unwrap();
    let demo_base = format!("http://127.0.0.1:{port}");
    wait_healthz(&demo_base, &mut demo, Duration::from_secs(20)).unwrap();

    // Prometheus scraping it every second.
    let prom_port = free_port();
    let config = tsdb.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: pfs\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
             static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let prom = pfs_tests::start_prometheus(&config, &tsdb.path().join("data"), prom_port)
        .unwrap_or_else(|e| panic!("prometheus not ready: {e:#}"));
    let prom_base = format!("http://127.0.0.1:{prom_port}");

    let wanted = [
        "wait/synch/mutex/kvstore/",
        "wait/synch/rwlock/kvstore/store",
        "wait/io/file/kvstore/",
    ];
    let names = poll(Duration::from_secs(40), || {
        let res = query(&prom_base, "pfs_events_waits_total")?;
        let names: BTreeSet<String> = res
            .iter()
            .filter_map(|r| r["metric"]["event_name"].as_str().map(str::to_string))
            .collect();
        Ok(wanted
            .iter()
            .all(|w| names.iter().any(|n| n.starts_with(w)))
            .then_some(names))
    })
    .unwrap_or_else(|e| {
        panic!(
            "Prometheus never saw all of {wanted:?} in pfs_events_waits_total: {e:#}\n{}\n{}",
            demo.describe(),
            prom.describe()
        )
    });
    eprintln!("prometheus_e2e: event_name values scraped: {names:?}");

    // Counters grow: a positive rate over the last 5 s of 1 s scrapes.
    let rates = poll(Duration::from_secs(20), || {
        let res = query(&prom_base, "rate(pfs_events_waits_total[5s])")?;
        let positive: Vec<(String, f64)> = res
            .iter()
            .filter_map(|r| {
                let name = r["metric"]["event_name"].as_str()?.to_string();
                let v: f64 = r["value"][1].as_str()?.parse().ok()?;
                (v > 0.0).then_some((name, v))
            })
            .collect();
        Ok((!positive.is_empty()).then_some(positive))
    })
    .unwrap_or_else(|e| panic!("rate(pfs_events_waits_total[5s]) never positive: {e:#}"));
    eprintln!("prometheus_e2e: positive rates: {rates:?}");
    assert!(
        rates
            .iter()
            .any(|(n, _)| n.starts_with("wait/synch/mutex/kvstore/")),
        "no positive rate for a kvstore mutex: {rates:?}"
    );

    // SIGTERM stops the demo and its child and removes their segments.
    assert!(
        !pfs_files(shm.path()).is_empty(),
        "the demo's workload has no segment in {}",
        shm.path().display()
    );
    demo.signal(libc::SIGTERM);
    let status = demo
        .wait_timeout(Duration::from_secs(10))
        .unwrap_or_else(|| {
            panic!(
                "demo did not exit within 10 s of SIGTERM\n{}",
                demo.describe()
            )
        });
    eprintln!("prometheus_e2e: demo exited with {status}");
    // A graceful shutdown: a normal exit (0, or the 128+15 convention), not
    // death by the signal itself (which would skip the cleanup).
    assert!(
        matches!(status.code(), Some(0 | 143)),
        "demo exit status after SIGTERM: {status}\n{}",
        demo.describe()
    );
    let left = pfs_files(shm.path());
    assert!(
        left.is_empty(),
        "segments left behind after SIGTERM: {left:?}"
    );
    drop(prom);
}
