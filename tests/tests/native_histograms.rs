//! Native and exponential histograms end to end. With the real Prometheus
//! (Debian's 2.42):
//! `pfs-test-writer spread` records waits spread over the latency
//! histogram (from nanoseconds to one above 8 s); one Prometheus with
//! `--enable-feature=native-histograms` scrapes the agent (protobuf, by
//! its `Accept` header) and one without it (text, classic buckets). The
//! native buckets Prometheus stored must equal the segment's, bucket for
//! bucket; `histogram_quantile` over the native histogram must match the
//! classic one within one bucket; a text scrape still gets the classic
//! buckets. With a real OTLP receiver (`tests/otlp_receiver.py`) and
//! `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram`,
//! the exponential histogram of scale 0 is the segment's, bucket for
//! bucket.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::{HISTOGRAM_BUCKETS, bucket_upper_seconds};
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_tests::{
    Agent, OtlpReceiver, Writer, free_port, otlp_metrics, poll, prom_query, start_prometheus_with,
};
use serde_json::Value;

const CLASS: &str = "wait/synch/mutex/test/spread";
const METRIC: &str = "pfs_events_waits_duration_seconds";

/// The class's buckets in the segment: live threads plus folded totals.
fn segment_buckets(path: &Path) -> Result<[u64; HISTOGRAM_BUCKETS]> {
    let seg = Segment::open(std::fs::File::open(path)?, false)?;
    let s = snapshot(&seg, &ReadOptions::default())?;
    let class = s
        .classes
        .iter()
        .find(|c| c.name == CLASS)
        .context("spread class registered")?;
    let mut b = [0u64; HISTOGRAM_BUCKETS];
    for (c, r) in s
        .exited
        .iter()
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()))
    {
        if *c == class.index {
            for (x, y) in b.iter_mut().zip(r.buckets.iter()) {
                *x += y;
            }
        }
    }
    Ok(b)
}

/// The `(lower, upper, count)` of each non-empty bucket as a native
/// histogram of schema 0 shows it: bucket 0 is the zero bucket
/// `[-2^-27, 2^-27]`, the overflow bucket is `(8, 16]`.
fn expected_native(b: &[u64; HISTOGRAM_BUCKETS]) -> Vec<(f64, f64, u64)> {
    let mut out = Vec::new();
    for (i, &n) in b.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let upper = bucket_upper_seconds(i).unwrap_or(16.0);
        if i == 0 {
            out.push((-upper, upper, n));
        } else {
            out.push((upper / 2.0, upper, n));
        }
    }
    out
}

fn prometheus(
    dir: &Path,
    agent_port: &str,
    native: bool,
) -> Result<(pfs_tests::ChildGuard, String)> {
    let name = if native { "native" } else { "classic" };
    let config = dir.join(format!("{name}.yml"));
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: pfs\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
             static_configs:\n      - targets: ['{agent_port}']\n"
        ),
    )?;
    let port = free_port();
    let flags: &[&str] = if native {
        &["--enable-feature=native-histograms"]
    } else {
        &[]
    };
    let prom = start_prometheus_with(&config, &dir.join(name), port, flags)?;
    Ok((prom, format!("http://127.0.0.1:{port}")))
}

fn f(v: &Value) -> Result<f64> {
    v.as_str()
        .context("a string number")?
        .parse()
        .with_context(|| format!("number {v}"))
}

/// The single value of an instant query.
fn scalar(base: &str, q: &str) -> Result<Option<f64>> {
    let r = prom_query(base, q)?;
    match r.first() {
        Some(s) => Ok(Some(f(&s["value"][1])?)),
        None => Ok(None),
    }
}

/// Runs `pfs-test-writer spread` in `shm` until its waits are done; gives
/// the writer (alive until finished) and the segment's buckets.
fn spread(shm: &Path) -> Result<(Writer, [u64; HISTOGRAM_BUCKETS])> {
    std::fs::create_dir(shm)?;
    let mut w = Writer::spawn(
        pfs_tests::writer_exe!(),
        &[
            "spread",
            "--shm-dir",
            shm.to_str().unwrap(),
            "--service",
            "spread",
        ],
    )?;
    let ready = w.read_json(Duration::from_secs(30))?;
    let segment = std::path::PathBuf::from(ready["segment"].as_str().context("segment")?);
    let done = w.read_json(Duration::from_secs(60))?;
    if done["done"] != true {
        bail!("unexpected line {done}");
    }
    let buckets = segment_buckets(&segment)?;
    let total: u64 = buckets.iter().sum();
    assert_eq!(
        total,
        done["waits"].as_u64().unwrap(),
        "every wait is timed"
    );
    assert!(
        buckets[HISTOGRAM_BUCKETS - 1] >= 1,
        "the 8.3 s wait overflows: {buckets:?}"
    );
    assert!(
        buckets.iter().filter(|&&n| n > 0).count() >= 6,
        "the waits spread: {buckets:?}"
    );
    Ok((w, buckets))
}

#[test]
fn native_histograms_are_exact_and_match_the_classic_ones() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shm = dir.path().join("shm");
    let (mut w, buckets) = spread(&shm)?;
    let total: u64 = buckets.iter().sum();

    let agent = Agent::serve(&shm)?;
    let agent_port = agent.base.trim_start_matches("http://").to_string();

    // The exposition follows the Accept header.
    let client: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut r = client
        .get(format!("{}/metrics", agent.base))
        .header(
            "accept",
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3",
        )
        .call()?;
    let ct = r
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()?
        .to_string();
    assert!(ct.starts_with("application/vnd.google.protobuf"), "{ct}");
    assert!(!r.body_mut().read_to_vec()?.is_empty());
    let text = agent.get("/metrics")?;
    assert!(
        text.body.contains(&format!("{METRIC}_bucket{{")),
        "text keeps classic buckets"
    );

    let (_native_prom, native) = prometheus(dir.path(), &agent_port, true)?;
    let (_classic_prom, classic) = prometheus(dir.path(), &agent_port, false)?;
    let sel = format!("{METRIC}{{service=\"spread\",event_name=\"{CLASS}\"}}");

    // Native: the stored buckets are the segment's.
    let hist = poll(Duration::from_secs(60), || {
        let r = prom_query(&native, &sel)?;
        Ok(r.first().and_then(|s| s.get("histogram")).cloned())
    })?;
    let h = &hist[1];
    assert_eq!(f(&h["count"])? as u64, total, "{h}");
    let mut got: Vec<(f64, f64, u64)> = h["buckets"]
        .as_array()
        .context("buckets")?
        .iter()
        .map(|b| Ok((f(&b[1])?, f(&b[2])?, f(&b[3])? as u64)))
        .collect::<Result<_>>()?;
    got.retain(|b| b.2 > 0);
    got.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(
        got,
        expected_native(&buckets),
        "native buckets vs the segment's"
    );

    // histogram_quantile: native vs classic, within one bucket.
    let classic_sel = format!("{METRIC}_bucket{{service=\"spread\",event_name=\"{CLASS}\"}}");
    for q in [0.1, 0.5, 0.75, 0.9, 0.99] {
        let c = poll(Duration::from_secs(60), || {
            scalar(&classic, &format!("histogram_quantile({q}, {classic_sel})"))
        })?;
        let n = scalar(&native, &format!("histogram_quantile({q}, {sel})"))?
            .context("native quantile")?;
        let buckets_apart = (n.log2() - c.log2()).abs();
        assert!(
            buckets_apart <= 1.0 + 1e-9,
            "q={q}: native {n} s, classic {c} s: {buckets_apart} buckets apart"
        );
    }
    w.finish(Duration::from_secs(20))?;
    Ok(())
}

#[test]
fn otlp_exponential_histograms_are_exact() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shm = dir.path().join("shm");
    let (mut w, buckets) = spread(&shm)?;
    let port = free_port();
    let mut receiver = OtlpReceiver::start(None, Some(port))?;
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "1000".to_string()),
        (
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
            "base2_exponential_bucket_histogram".to_string(),
        ),
    ];
    let agent = Agent::serve_with_env(&shm, &env)?;
    let point_of = |m: &Value| -> Option<Value> {
        m["points"]
            .as_array()?
            .iter()
            .find(|p| p["attributes"]["event_name"] == CLASS)
            .cloned()
    };
    let req = receiver
        .wait_for(Duration::from_secs(30), |r| {
            otlp_metrics(r, "pfs.events.waits.duration")
                .iter()
                .any(|(_, m)| point_of(m).is_some())
        })
        .with_context(|| agent.guard.describe())?;
    let (_, m) = otlp_metrics(&req, "pfs.events.waits.duration")
        .into_iter()
        .find(|(_, m)| point_of(m).is_some())
        .context("the spread histogram")?;
    assert_eq!(m["type"], "exponential_histogram", "{m}");
    assert_eq!(m["unit"], "s");
    let p = point_of(m).unwrap();
    assert_eq!(p["count"], buckets.iter().sum::<u64>(), "{p}");
    assert_eq!(p["scale"], 0);
    assert_eq!(p["zero_count"], buckets[0]);
    assert_eq!(p["zero_threshold"].as_f64(), Some(2f64.powi(-27)));
    // OTLP bucket j holds (2^j, 2^(j+1)]: segment bucket i ≥ 1 is j = i - 28.
    let first = (1..HISTOGRAM_BUCKETS).find(|&i| buckets[i] > 0).unwrap();
    let last = (1..HISTOGRAM_BUCKETS).rfind(|&i| buckets[i] > 0).unwrap();
    assert_eq!(p["offset"], first as i64 - 28, "{p}");
    let got: Vec<u64> = p["bucket_counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(
        got,
        buckets[first..=last],
        "bucket for bucket the segment's"
    );
    assert!(p["negative_counts"].as_array().unwrap().is_empty());
    w.finish(Duration::from_secs(20))?;
    Ok(())
}
