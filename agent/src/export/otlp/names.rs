//! How OTLP names become Prometheus names (the OpenTelemetry →
//! Prometheus compatibility rules, as the Collector and Prometheus' OTLP
//! receiver apply them), so that each family's OTel name is checked to
//! translate into exactly its `/metrics` name.

use crate::export::model::{Family, Kind};

/// Prometheus unit word of a UCUM unit (the translation table of the
/// OpenTelemetry → Prometheus compatibility specification, as used by the
/// Collector and Prometheus' OTLP receiver).
fn ucum_word(u: &str) -> String {
    match u {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "%" => "percent",
        other => other,
    }
    .to_string()
}

fn per_word(u: &str) -> String {
    match u {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        other => other,
    }
    .to_string()
}

/// Splits on everything but ASCII letters, digits and `:`, and joins the
/// non-empty pieces with `_`.
fn sanitize(s: &str) -> String {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == ':'))
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

/// The Prometheus name an OTLP metric `name` with `unit` becomes under the
/// OpenTelemetry → Prometheus translation (with suffixes): invalid
/// characters become `_`, the UCUM unit is appended as a word unless the
/// name already ends with it (`{annotation}` units add nothing; `1` adds
/// `_ratio` to gauges only), and monotonic sums get `_total`.
pub fn prometheus_name(name: &str, unit: &str, monotonic_sum: bool, gauge: bool) -> String {
    let mut n = sanitize(name);
    // Annotations in braces are dropped from units.
    let mut u = String::new();
    let mut depth = 0;
    for c in unit.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            c if depth == 0 => u.push(c),
            _ => {}
        }
    }
    let u = u.trim();
    let suffix = if u == "1" {
        if gauge {
            "ratio".to_string()
        } else {
            String::new()
        }
    } else if let Some((a, b)) = u.split_once('/') {
        let (a, b) = (sanitize(&ucum_word(a)), sanitize(&per_word(b)));
        match (a.is_empty(), b.is_empty()) {
            (false, false) => format!("{a}_per_{b}"),
            (false, true) => a,
            (true, false) => format!("per_{b}"),
            (true, true) => String::new(),
        }
    } else {
        sanitize(&ucum_word(u))
    };
    if !suffix.is_empty() && !n.ends_with(&format!("_{suffix}")) && n != suffix {
        n.push('_');
        n.push_str(&suffix);
    }
    if monotonic_sum && !n.ends_with("_total") {
        n.push_str("_total");
    }
    n
}

/// What `f` becomes in Prometheus when sent over OTLP: a monotonic sum for
/// counters, a gauge for gauges and info families, a histogram.
pub fn translated_name(f: &Family) -> String {
    prometheus_name(
        f.otel_name,
        f.otel_unit,
        f.kind == Kind::Counter,
        matches!(f.kind, Kind::Gauge | Kind::Info),
    )
}

/// The OTLP type of a family's metric.
pub fn otlp_type(k: Kind) -> &'static str {
    match k {
        Kind::Counter => "Sum (monotonic)",
        Kind::Gauge | Kind::Info => "Gauge",
        Kind::Histogram => "Histogram",
    }
}

/// The name mapping of `families` as a Markdown table (docs/OTLP.md).
pub fn mapping_table(families: &[Family]) -> String {
    let mut out = String::from(
        "| OTel name | OTel unit | OTLP type | Prometheus name |\n|---|---|---|---|\n",
    );
    let mut seen = std::collections::BTreeSet::new();
    for f in families {
        if seen.insert(f.otel_name) {
            let unit = if f.otel_unit.is_empty() {
                "(none)".to_string()
            } else {
                format!("`{}`", f.otel_unit)
            };
            out.push_str(&format!(
                "| `{}` | {unit} | {} | `{}` |\n",
                f.otel_name,
                otlp_type(f.kind),
                f.prometheus_name()
            ));
        }
    }
    out
}
