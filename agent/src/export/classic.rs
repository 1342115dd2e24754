//! The classic Prometheus text exposition (`text/plain; version=0.0.4`),
//! derived line by line from the OpenMetrics text that `prometheus-client`
//! writes: for the scrapers and tools that read only the older format
//! (`promtool check metrics`, older agents), when their `Accept` header
//! prefers it.
//!
//! The two formats carry the same samples; they differ in the metadata
//! lines and a few sample forms:
//!
//! | OpenMetrics | classic |
//! |---|---|
//! | `# TYPE x counter`, samples `x_total` | `# TYPE x_total counter` (and `# HELP x_total`) |
//! | `# TYPE x info`, sample `x_info` | `# TYPE x_info gauge` |
//! | `# TYPE x unknown` | `# TYPE x untyped` |
//! | `# TYPE x stateset` | `# TYPE x gauge` |
//! | `# UNIT x unit`, `# EOF` | dropped |
//! | `x_created` samples | dropped |
//! | exemplars (`… # {trace_id="…"} 1.0`) | dropped |
//! | `\"` in `# HELP` text | `"` (the classic format escapes only `\\` and `\n` there) |
//! | sample timestamps in seconds | milliseconds |

/// The classic text exposition of `openmetrics`, an OpenMetrics text
/// exposition.
///
/// ```
/// use pfs_agent::export::classic::from_openmetrics;
///
/// let om = "# HELP pfs_events_waits Waits.\n# TYPE pfs_events_waits counter\npfs_events_waits_total{event_name=\"a\"} 3\n# EOF\n";
/// assert_eq!(
///     from_openmetrics(om),
///     "# HELP pfs_events_waits_total Waits.\n# TYPE pfs_events_waits_total counter\npfs_events_waits_total{event_name=\"a\"} 3\n"
/// );
/// ```
pub fn from_openmetrics(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The family being written: its name and OpenMetrics type.
    let mut family: (&str, &str) = ("", "");
    let mut pending_help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (kind, name, rest) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            match kind {
                "HELP" => pending_help = Some((name, rest)),
                "TYPE" => {
                    family = (name, rest);
                    let (classic_name, classic_type) = classic_family(name, rest);
                    if let Some((help_name, text)) = pending_help.take()
                        && help_name == name
                    {
                        out.push_str("# HELP ");
                        out.push_str(&classic_name);
                        out.push(' ');
                        out.push_str(&text.replace("\\\"", "\""));
                        out.push('\n');
                    }
                    out.push_str("# TYPE ");
                    out.push_str(&classic_name);
                    out.push(' ');
                    out.push_str(classic_type);
                    out.push('\n');
                }
                // UNIT, EOF and any other metadata: no classic form.
                _ => {}
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let (name, labels, rest) = split_sample(line);
        if name.ends_with("_created") && matches!(family.1, "counter" | "histogram" | "summary") {
            continue;
        }
        out.push_str(name);
        out.push_str(labels);
        // The value and an optional timestamp; an exemplar (after `#`) is
        // dropped.
        let mut fields = rest.split_whitespace().take_while(|f| !f.starts_with('#'));
        if let Some(value) = fields.next() {
            out.push(' ');
            out.push_str(value);
        }
        if let Some(ts) = fields.next()
            && let Ok(secs) = ts.parse::<f64>()
        {
            out.push(' ');
            out.push_str(&format!("{}", (secs * 1000.0).round() as i64));
        }
        out.push('\n');
    }
    out
}

/// The classic name and type of an OpenMetrics family.
fn classic_family(name: &str, om_type: &str) -> (String, &'static str) {
    match om_type {
        "counter" => (format!("{name}_total"), "counter"),
        "info" => (format!("{name}_info"), "gauge"),
        "gauge" | "stateset" => (name.to_string(), "gauge"),
        "histogram" => (name.to_string(), "histogram"),
        "summary" => (name.to_string(), "summary"),
        _ => (name.to_string(), "untyped"),
    }
}

/// A sample line's metric name, its label set (`{…}` or empty, quotes
/// and escapes honoured) and what follows it.
fn split_sample(line: &str) -> (&str, &str, &str) {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, after) = line.split_at(name_end);
    if !after.starts_with('{') {
        return (name, "", after);
    }
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in after.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return (name, &after[..=i], &after[i + 1..]),
            _ => {}
        }
    }
    (name, after, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_kind_and_sample_form() {
        let om = concat!(
            "# HELP pfs_agent_build Build \\\"info\\\".\n",
            "# TYPE pfs_agent_build info\n",
            "pfs_agent_build_info{version=\"1\"} 1\n",
            "# HELP pfs_wait_seconds Latency.\n",
            "# TYPE pfs_wait_seconds histogram\n",
            "# UNIT pfs_wait_seconds seconds\n",
            "pfs_wait_seconds_bucket{le=\"0.5\",event_name=\"a}b # c\"} 2 # {trace_id=\"x\"} 0.4 1.5\n",
            "pfs_wait_seconds_bucket{le=\"+Inf\",event_name=\"a}b # c\"} 3\n",
            "pfs_wait_seconds_sum{event_name=\"a}b # c\"} 1.25\n",
            "pfs_wait_seconds_count{event_name=\"a}b # c\"} 3\n",
            "pfs_wait_seconds_created{event_name=\"a}b # c\"} 1.7e9\n",
            "# HELP pfs_lost Lost.\n",
            "# TYPE pfs_lost counter\n",
            "pfs_lost_total 0 12.5\n",
            "pfs_lost_created 1.7e9\n",
            "# TYPE pfs_odd unknown\n",
            "pfs_odd 4\n",
            "# HELP pfs_used Bytes in use.\n",
            "# TYPE pfs_used gauge\n",
            "pfs_used{q=\"a\\\"b\\\\\"} -1\n",
            "# EOF\n",
        );
        let want = concat!(
            "# HELP pfs_agent_build_info Build \"info\".\n",
            "# TYPE pfs_agent_build_info gauge\n",
            "pfs_agent_build_info{version=\"1\"} 1\n",
            "# HELP pfs_wait_seconds Latency.\n",
            "# TYPE pfs_wait_seconds histogram\n",
            "pfs_wait_seconds_bucket{le=\"0.5\",event_name=\"a}b # c\"} 2\n",
            "pfs_wait_seconds_bucket{le=\"+Inf\",event_name=\"a}b # c\"} 3\n",
            "pfs_wait_seconds_sum{event_name=\"a}b # c\"} 1.25\n",
            "pfs_wait_seconds_count{event_name=\"a}b # c\"} 3\n",
            "# HELP pfs_lost_total Lost.\n",
            "# TYPE pfs_lost_total counter\n",
            "pfs_lost_total 0 12500\n",
            "# TYPE pfs_odd untyped\n",
            "pfs_odd 4\n",
            "# HELP pfs_used Bytes in use.\n",
            "# TYPE pfs_used gauge\n",
            "pfs_used{q=\"a\\\"b\\\\\"} -1\n",
        );
        assert_eq!(from_openmetrics(om), want);
    }
}
