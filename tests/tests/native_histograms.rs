//! Native and exponential histograms end to end. With the real Prometheus
//! (Debian's 2.42):
//! `pfs-test-writer spread` records waits spread over the latency
//! histogram (from nanoseconds to one above 8 s), each in a statement
//! (whose buckets reach 1024 s: the 8.3 s one is in a finite bucket,
//! (8 s, 16 s]); one Prometheus with
//! `--enable-feature=native-histograms` scrapes the agent (protobuf, by
//! its `Accept` header) and one without it (text, classic buckets). The
//! native buckets Prometheus stored must equal the segment's, bucket for
//! bucket, for the waits and for the statements (their zero bucket
//! 2^-27 s and 2^-20 s); `histogram_quantile` over the native histogram must match the
//! classic one within one bucket; a text scrape still gets the classic
//! buckets. With a real OTLP receiver (`tests/otlp_receiver.py`) and
//! `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram`,
//! the exponential histogram of scale 0 is the segment's, bucket for
//! bucket.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::{BucketScale, HISTOGRAM_BUCKETS};
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_tests::{
    Agent, OtlpReceiver, Writer, free_port, otlp_metrics, poll, prom_query, start_prometheus_with,
};
use serde_json::Value;

const CLASS: &str = "wait/synch/mutex/test/spread";
const METRIC: &str = "pfs_events_waits_duration_seconds";
const STATEMENT: &str = "statement/test/spread";
const STATEMENT_METRIC: &str = "pfs_events_statements_duration_seconds";

/// The buckets of class `name` in the segment: live threads plus folded
/// totals.
fn segment_buckets(path: &Path, name: &str) -> Result<[u64; HISTOGRAM_BUCKETS]> {
    let seg = Segment::open(std::fs::File::open(path)?, false)?;
    let s = snapshot(&seg, &ReadOptions::default())?;
    let class = s
        .classes
        .iter()
        .find(|c| c.name == name)
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

/// The `(lower, upper, count)` of each non-empty bucket in `scale` as a
/// native histogram of schema 0 shows it: bucket 0 is the zero bucket
/// (`[-2^-27, 2^-27]` for waits), the overflow bucket is the next one up
/// (`(8, 16]` for waits).
fn expected_native(b: &[u64; HISTOGRAM_BUCKETS], scale: BucketScale) -> Vec<NativeBucket> {
    let top = scale.upper_seconds(HISTOGRAM_BUCKETS - 2).unwrap() * 2.0;
    let mut out = Vec::new();
    for (i, &n) in b.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let upper = scale.upper_seconds(i).unwrap_or(top);
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

/// The segment's buckets of the spread waits and of their statements.
struct Spread {
    waits: [u64; HISTOGRAM_BUCKETS],
    statements: [u64; HISTOGRAM_BUCKETS],
}

/// Runs `pfs-test-writer spread` in `shm` until its waits are done; gives
/// the writer (alive until finished) and the segment's buckets.
fn spread(shm: &Path) -> Result<(Writer, Spread)> {
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
    let buckets = segment_buckets(&segment, CLASS)?;
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
    let statements = segment_buckets(&segment, STATEMENT)?;
    assert_eq!(
        statements.iter().sum::<u64>(),
        total,
        "a statement per wait"
    );
    let long = BucketScale::Long;
    assert_eq!(statements[HISTOGRAM_BUCKETS - 1], 0, "{statements:?}");
    assert_eq!(
        statements[long.index(16_000_000_000_000)],
        1,
        "the 8.3 s statement is in (8 s, 16 s]: {statements:?}"
    );
    Ok((
        w,
        Spread {
            waits: buckets,
            statements,
        },
    ))
}

/// A native bucket as Prometheus's API gives it: `(lower, upper, count)`.
type NativeBucket = (f64, f64, u64);

/// The non-empty buckets and the count of the native histogram `sel` in
/// the Prometheus at `base`, once it has one.
fn native_buckets(base: &str, sel: &str) -> Result<(Vec<NativeBucket>, u64)> {
    let hist = poll(Duration::from_secs(60), || {
        let r = prom_query(base, sel)?;
        Ok(r.first().and_then(|s| s.get("histogram")).cloned())
    })?;
    let h = &hist[1];
    let mut got: Vec<NativeBucket> = h["buckets"]
        .as_array()
        .context("buckets")?
        .iter()
        .map(|b| Ok((f(&b[1])?, f(&b[2])?, f(&b[3])? as u64)))
        .collect::<Result<_>>()?;
    got.retain(|b| b.2 > 0);
    got.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok((got, f(&h["count"])? as u64))
}

#[test]
fn native_histograms_are_exact_and_match_the_classic_ones() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shm = dir.path().join("shm");
    let (mut w, spread) = spread(&shm)?;
    let total: u64 = spread.waits.iter().sum();

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
    // The statements' classic buckets go from 2^-20 s to 1024 s: the
    // 8.3 s statement is below le="16", above le="8".
    let le = |le: &str| {
        let (bound, class) = (
            format!("le=\"{le}\""),
            format!("event_name=\"{STATEMENT}\""),
        );
        text.body
            .lines()
            .filter(|l| l.starts_with(&format!("{STATEMENT_METRIC}_bucket{{")))
            .find(|l| l.contains(&bound) && l.contains(&class))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    assert_eq!(le("16.0"), Some(total), "{}", text.body);
    assert_eq!(le("8.0"), Some(total - 1));
    assert_eq!(le("1024.0"), Some(total));
    assert_eq!(le("9.5367431640625e-7"), Some(spread.statements[0]));

    let (_native_prom, native) = prometheus(dir.path(), &agent_port, true)?;
    let (_classic_prom, classic) = prometheus(dir.path(), &agent_port, false)?;
    let sel = format!("{METRIC}{{service=\"spread\",event_name=\"{CLASS}\"}}");

    // Native: the stored buckets are the segment's, waits and statements.
    let (got, count) = native_buckets(&native, &sel)?;
    assert_eq!(count, total);
    assert_eq!(
        got,
        expected_native(&spread.waits, BucketScale::Short),
        "native wait buckets vs the segment's"
    );
    let (got, count) = native_buckets(
        &native,
        &format!("{STATEMENT_METRIC}{{service=\"spread\",event_name=\"{STATEMENT}\"}}"),
    )?;
    assert_eq!(count, total);
    assert_eq!(
        got,
        expected_native(&spread.statements, BucketScale::Long),
        "native statement buckets vs the segment's"
    );
    assert!(got.contains(&(8.0, 16.0, 1)), "{got:?}");

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
    // The slowest statement's quantile reads where it lies, not at 8 s.
    let top = poll(Duration::from_secs(60), || {
        scalar(
            &classic,
            &format!(
                "histogram_quantile(1, {STATEMENT_METRIC}_bucket{{service=\"spread\",event_name=\"{STATEMENT}\"}})"
            ),
        )
    })?;
    assert_eq!(top, 16.0, "the 8.3 s statement's bucket bound");
    w.finish(Duration::from_secs(20))?;
    Ok(())
}

#[test]
fn otlp_exponential_histograms_are_exact() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shm = dir.path().join("shm");
    let (mut w, spread) = spread(&shm)?;
    let buckets = spread.waits;
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
    let point_of = |m: &Value, class: &str| -> Option<Value> {
        m["points"]
            .as_array()?
            .iter()
            .find(|p| p["attributes"]["event_name"] == class)
            .cloned()
    };
    let cases = [
        (
            "pfs.events.waits.duration",
            CLASS,
            buckets,
            BucketScale::Short,
        ),
        (
            "pfs.events.statements.duration",
            STATEMENT,
            spread.statements,
            BucketScale::Long,
        ),
    ];
    for (metric, class, buckets, scale) in cases {
        let req = receiver
            .wait_for(Duration::from_secs(30), |r| {
                otlp_metrics(r, metric)
                    .iter()
                    .any(|(_, m)| point_of(m, class).is_some())
            })
            .with_context(|| agent.guard.describe())?;
        let (_, m) = otlp_metrics(&req, metric)
            .into_iter()
            .find(|(_, m)| point_of(m, class).is_some())
            .context("the spread histogram")?;
        assert_eq!(m["type"], "exponential_histogram", "{m}");
        assert_eq!(m["unit"], "s");
        let p = point_of(m, class).unwrap();
        assert_eq!(p["count"], buckets.iter().sum::<u64>(), "{p}");
        assert_eq!(p["scale"], 0);
        assert_eq!(p["zero_count"], buckets[0]);
        // 2^-27 for waits, 2^-20 for statements.
        let z = scale.log2_seconds_0();
        assert_eq!(p["zero_threshold"].as_f64(), Some(2f64.powi(z)));
        // OTLP bucket j holds (2^j, 2^(j+1)]: segment bucket i ≥ 1 is
        // j = i + z - 1 (i - 28 for waits).
        let first = (1..HISTOGRAM_BUCKETS).find(|&i| buckets[i] > 0).unwrap();
        let last = (1..HISTOGRAM_BUCKETS).rfind(|&i| buckets[i] > 0).unwrap();
        assert_eq!(p["offset"], first as i64 + i64::from(z) - 1, "{p}");
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
    }
    w.finish(Duration::from_secs(20))?;
    Ok(())
}
