//! `pfs-agent query TABLE`: one table read directly from the segments,
//! printed as text (durations readable on a terminal, as MySQL's
//! `FORMAT_PICO_TIME` writes them) or as the API's JSON (picoseconds),
//! since the last `TRUNCATE` as the API shows it (the baselines file the
//! serving agent keeps in the directory; read, never changed).

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::bail;
use pfs_agent::filter::{Filter, Spelling};
use pfs_agent::segments::{OwnerPolicy, SegmentSet};
use pfs_agent::snapshot::Snapshotter;
use pfs_agent::tables::{self, ColumnKind, Table};
use pfs_agent::truncate::Baselines;
use serde_json::Value;

use super::require_dir;
use crate::cli::{Format, QueryArgs};

/// Prints the table as text or JSON.
pub fn run(a: QueryArgs) -> anyhow::Result<()> {
    require_dir(&a.dir.shm_dir)?;
    let Some(table) = tables::lookup(&a.table) else {
        bail!("{}", tables::not_found(&a.table));
    };
    let policy = a.policy.policy();
    // The TRUNCATE file is the serving agent's: under `--require-owner
    // uid` this user's too; under `group`, a member of the group may query
    // as another user, so its owner is not checked here.
    let own_files_only = policy.owner == OwnerPolicy::Uid;
    let snap = Snapshotter::new(
        SegmentSet::new(&a.dir.shm_dir, Duration::MAX)
            .with_policy(policy)
            .without_death_reports(),
        Duration::ZERO,
    )
    .take();
    let filter = Filter {
        service: a.service,
        pid: a.pid,
    };
    // An empty answer is valid, but easy to take for "nothing happened"
    // when the name is mistyped: said (and, in JSON, in the answer's
    // `warning` member, as the API does).
    let unmatched = tables::unmatched(table, &snap, &filter, Spelling::Flags);
    if snap.segments.is_empty() {
        // Logged (not printed) so that `PFS_LOG_FORMAT=json` stays JSON.
        let dir = a.dir.shm_dir.display();
        // Segment files neither read nor refused: empty, or being created
        // (a process starting), which a one-shot read does not wait for.
        let unready = segment_files(&a.dir.shm_dir).saturating_sub(snap.invalid.len());
        let unready = match unready {
            0 => String::new(),
            n => format!(
                "; {n} segment file(s) not initialised (empty, or a process is creating it: retry in a moment)"
            ),
        };
        if snap.invalid.is_empty() && unready.is_empty() {
            tracing::warn!(
                "no segments in {dir}: is PFS_SHM_DIR of the instrumented processes {dir}, and do they call pfs_client::init() (pfs_init() in C), which creates the segment?"
            );
        } else if snap.invalid.is_empty() {
            tracing::warn!("no readable segment in {dir}{unready}: the table is empty");
        } else if unready.is_empty() {
            tracing::warn!(
                "every segment file in {dir} was refused ({} file(s); the warnings above say why): the table is empty",
                snap.invalid.len()
            );
        } else {
            tracing::warn!(
                "no readable segment in {dir}: {} segment file(s) refused (the warnings above say why){unready}: the table is empty",
                snap.invalid.len()
            );
        }
    } else if let Some(w) = &unmatched {
        tracing::warn!("{w}");
    }
    // As the API shows it: since the last TRUNCATE (the agent serving the
    // directory keeps its baselines there).
    let baselines = Baselines::peek(&a.dir.shm_dir, own_files_only);
    let mut table = tables::build(table, &snap, &filter, &baselines);
    // As `SELECT columns ... WHERE c = v AND ... ORDER BY order_by [DESC]
    // LIMIT limit`.
    for (col, value) in &a.filters {
        table.filter(col, value)?;
    }
    if let Some(col) = &a.order_by {
        table.order_by(col, a.desc)?;
    }
    if let Some(n) = a.limit {
        table.rows.truncate(n);
    }
    if !a.columns.is_empty() {
        table.select(&a.columns)?;
    }
    match a.format {
        Format::Json => {
            let mut json = table.to_json();
            if let Some(w) = unmatched {
                json["warning"] = w.into();
            }
            super::print_out(&format!("{}\n", serde_json::to_string_pretty(&json)?))?;
        }
        Format::Text | Format::Vertical => {
            let human = a.human_times || (!a.raw_times && std::io::stdout().is_terminal());
            if human {
                readable_durations(&mut table);
            }
            super::print_out(&if a.format == Format::Vertical {
                table.to_vertical()
            } else {
                table.to_text()
            })?;
        }
    }
    Ok(())
}

/// How many entries of `dir` are named as segment files (0 if it cannot
/// be listed).
fn segment_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| pfs_shm_layout::files::is_segment_file(&e.path()))
            .count()
    })
}

/// Replaces the picoseconds of every [`ColumnKind::Duration`] column by
/// their [`format_pico_time`] text (`NULL` stays `NULL`).
fn readable_durations(table: &mut Table) {
    let durations: Vec<usize> = (0..table.columns.len())
        .filter(|&i| tables::column_kind(table.columns[i]) == ColumnKind::Duration)
        .collect();
    for row in &mut table.rows {
        for &i in &durations {
            let ps = match &row[i] {
                // Beyond 64 bits a picosecond cell is a float.
                Value::Number(n) => n
                    .as_u64()
                    .map(u128::from)
                    .or_else(|| n.as_f64().map(|f| f as u128)),
                _ => None,
            };
            if let Some(ps) = ps {
                row[i] = Value::String(format_pico_time(ps));
            }
        }
    }
}

/// The units of [`format_pico_time`], largest first, in picoseconds.
const UNITS: [(f64, &str); 7] = [
    (86_400e12, "d"),
    (3_600e12, "h"),
    (60e12, "min"),
    (1e12, "s"),
    (1e9, "ms"),
    (1e6, "us"),
    (1e3, "ns"),
];

/// `ps` as MySQL 8.0's `FORMAT_PICO_TIME()` writes it (the built-in that
/// replaced `sys.format_time`, which wrote `m` for minutes): the value in the largest unit it reaches
/// (`d`, `h`, `min`, `s`, `ms`, `us`, `ns`) with two decimals (`%4.2f`,
/// `471.87 ms`), in exponent form from 100 000 of a unit on (`%4.2e`,
/// `1.23e+05 d`); below one nanosecond whole picoseconds, right-aligned in
/// three places (`%3d ps`, `  5 ps`). Like MySQL, the value is a double
/// before it is compared and divided.
pub fn format_pico_time(ps: u128) -> String {
    let t = ps as f64;
    let Some(&(divisor, unit)) = UNITS.iter().find(|(d, _)| t >= *d) else {
        return format!("{ps:>3} ps");
    };
    let v = t / divisor;
    if v >= 100_000.0 {
        // C's `%.2e`: a sign and at least two digits in the exponent.
        let e = format!("{v:.2e}");
        let (mantissa, exp) = e.split_once('e').expect("`{:e}` has an exponent");
        let exp: i32 = exp.parse().expect("`{:e}` exponent is a number");
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02} {unit}", exp.unsigned_abs())
    } else {
        format!("{v:.2} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each unit at its lower boundary and just below it, and MySQL's own
    /// examples (8.0 manual, `FORMAT_PICO_TIME`).
    #[test]
    fn pico_times_as_mysql_formats_them() {
        for (ps, want) in [
            (0, "  0 ps"),
            (5, "  5 ps"),
            (999, "999 ps"),
            (1_000, "1.00 ns"),
            (3_501, "3.50 ns"),
            (2_401, "2.40 ns"),
            (999_994, "999.99 ns"),
            (999_999, "1000.00 ns"),
            (1_000_000, "1.00 us"),
            (999_999_999, "1000.00 us"),
            (1_000_000_000, "1.00 ms"),
            (471_873_326_000, "471.87 ms"),
            (999_999_999_999, "1000.00 ms"),
            (1_000_000_000_000, "1.00 s"),
            (3_501_000_000_000, "3.50 s"),
            (59_999_999_999_999, "60.00 s"),
            (60_000_000_000_000, "1.00 min"),
            (188_732_396_662_000, "3.15 min"),
            (3_599_999_999_999_999, "60.00 min"),
            (3_600_000_000_000_000, "1.00 h"),
            (86_399_999_999_999_000, "24.00 h"),
            (86_400_000_000_000_000, "1.00 d"),
            (432_112_344_321_234_545, "5.00 d"),
            (u128::from(u64::MAX), "213.50 d"),
            (u128::from(u64::MAX) * 1_000, "2.14e+05 d"),
        ] {
            assert_eq!(format_pico_time(ps), want, "{ps} ps");
        }
        // Ties round to even, as C's printf does.
        assert_eq!(format_pico_time(1_125), "1.12 ns");
    }

    #[test]
    fn only_duration_columns_become_text() {
        let mut t = Table {
            name: "events_waits_history".into(),
            columns: vec!["event_id", "timer_start", "timer_wait", "spins"],
            rows: vec![
                vec![
                    Value::from(7),
                    Value::from(5_000_000_000_000u64),
                    Value::from(471_873_326_000u64),
                    Value::from(1_000_000),
                ],
                vec![Value::from(8), Value::Null, Value::Null, Value::Null],
                vec![
                    Value::from(9),
                    Value::from(1),
                    Value::from(18446744073709551616000f64),
                    Value::from(0),
                ],
            ],
        };
        readable_durations(&mut t);
        assert_eq!(
            t.rows[0],
            [
                Value::from(7),
                Value::from(5_000_000_000_000u64),
                Value::from("471.87 ms"),
                Value::from(1_000_000),
            ]
        );
        assert_eq!(t.rows[1][2], Value::Null);
        assert_eq!(t.rows[2][2], Value::from("2.14e+05 d"));
    }
}
