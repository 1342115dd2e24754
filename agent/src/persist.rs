//! Layer 1: the JSON forms in which the agent's own files (retired totals,
//! `TRUNCATE` baselines) keep summaries and memory statistics.

use pfs_shm_layout::layout::{BucketScale, HISTOGRAM_BUCKETS};
use pfs_shm_layout::reader::{IoFigures, MemoryStats, Summary};
use pfs_shm_layout::values::StatementFigures;
use serde::{Deserialize, Serialize};

/// A summary in a file that cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// The histogram has the wrong number of buckets.
    #[error("class {name}: {found} histogram buckets, expected {HISTOGRAM_BUCKETS}")]
    Buckets {
        /// The class (instrument) name.
        name: String,
        /// Buckets found.
        found: usize,
    },
    /// `sum_ps` is not a decimal number.
    #[error("class {name}: sum_ps {found:?} is not a number")]
    Sum {
        /// The class (instrument) name.
        name: String,
        /// The text found.
        found: String,
    },
}

/// A [`Summary`] in the agent's JSON files: the statement figures sit
/// beside the other fields (one flat object).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SummaryJson {
    count: u64,
    timed_count: u64,
    /// Decimal: a `u128` does not fit a JSON number everywhere.
    sum_ps: String,
    min_ps: u64,
    max_ps: u64,
    bytes: u64,
    buckets: Vec<u64>,
    /// What the buckets span ([`BucketScale`]); files written before
    /// layout 8.0 have none: the wait scale, every kind's then.
    #[serde(default)]
    bucket_scale: ScaleJson,
    #[serde(flatten)]
    statement: FiguresJson,
    /// A file or socket class's figures by I/O mode ([`IoFigures`]);
    /// absent when all zero (every other class), and in files written
    /// before layout 8.1. (An older agent ignores it.)
    #[serde(default, skip_serializing_if = "IoJson::is_zero")]
    io: IoJson,
}

/// [`IoFigures`] in the agent's JSON files: each array by
/// [`pfs_shm_layout::IoMode::index`] (read, write, misc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct IoJson {
    count: [u64; 3],
    sum_ns: [u64; 3],
    bytes: [u64; 2],
}

impl IoJson {
    fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

impl From<&IoFigures> for IoJson {
    fn from(f: &IoFigures) -> Self {
        Self {
            count: f.count,
            sum_ns: f.sum_ns,
            bytes: f.bytes,
        }
    }
}

impl From<&IoJson> for IoFigures {
    fn from(f: &IoJson) -> Self {
        Self {
            count: f.count,
            sum_ns: f.sum_ns,
            bytes: f.bytes,
        }
    }
}

/// A [`BucketScale`] in the agent's JSON files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ScaleJson {
    #[default]
    Short,
    Long,
}

impl From<BucketScale> for ScaleJson {
    fn from(s: BucketScale) -> Self {
        match s {
            BucketScale::Short => Self::Short,
            BucketScale::Long => Self::Long,
        }
    }
}

impl From<ScaleJson> for BucketScale {
    fn from(s: ScaleJson) -> Self {
        match s {
            ScaleJson::Short => Self::Short,
            ScaleJson::Long => Self::Long,
        }
    }
}

/// `FiguresJson` has the fields of [`StatementFigures`] that a summary
/// keeps (all but `digest`): the struct and the conversions both ways,
/// from one list of them.
macro_rules! figures_json {
    ($($(#[$attr:meta])* $field:ident),* $(,)?) => {
        /// A summary's [`StatementFigures`] in the agent's JSON files.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        struct FiguresJson {
            $($(#[$attr])* $field: u64,)*
        }

        impl From<&StatementFigures> for FiguresJson {
            fn from(f: &StatementFigures) -> Self {
                Self { $($field: f.$field),* }
            }
        }

        impl From<&FiguresJson> for StatementFigures {
            fn from(f: &FiguresJson) -> Self {
                Self { $($field: f.$field,)* ..Self::default() }
            }
        }
    };
}

figures_json!(
    errors,
    warnings,
    rows_affected,
    rows_sent,
    rows_examined,
    // Since layout 3.1: files written before have none (zero).
    #[serde(default)]
    cpu_time_ps,
    #[serde(default)]
    cancelled,
);

/// [`MemoryStats`] in the agent's JSON files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryJson {
    count_alloc: u64,
    count_free: u64,
    bytes_alloc: u64,
    bytes_free: u64,
    low_count: i64,
    current_count: i64,
    high_count: i64,
    low_bytes: i64,
    current_bytes: i64,
    high_bytes: i64,
}

impl SummaryJson {
    /// The JSON form of `s`.
    pub fn of(s: &Summary) -> Self {
        Self {
            count: s.count,
            timed_count: s.timed_count,
            sum_ps: s.sum_ps.to_string(),
            min_ps: s.min_ps,
            max_ps: s.max_ps,
            bytes: s.bytes,
            buckets: s.buckets.to_vec(),
            bucket_scale: s.scale.into(),
            statement: FiguresJson::from(&s.statement),
            io: IoJson::from(&s.io),
        }
    }

    /// Back to a [`Summary`]; `name` says where in errors.
    pub fn get(&self, name: &str) -> Result<Summary, JsonError> {
        if self.buckets.len() != HISTOGRAM_BUCKETS {
            return Err(JsonError::Buckets {
                name: name.to_string(),
                found: self.buckets.len(),
            });
        }
        let mut s = Summary {
            count: self.count,
            timed_count: self.timed_count,
            sum_ps: self.sum_ps.parse().map_err(|_| JsonError::Sum {
                name: name.to_string(),
                found: self.sum_ps.clone(),
            })?,
            min_ps: self.min_ps,
            max_ps: self.max_ps,
            bytes: self.bytes,
            statement: StatementFigures::from(&self.statement),
            io: IoFigures::from(&self.io),
            scale: self.bucket_scale.into(),
            ..Summary::default()
        };
        s.buckets.copy_from_slice(&self.buckets);
        Ok(s)
    }
}

/// `MemoryJson` and `MemoryStats` have the same fields: the conversions
/// both ways, from one list of them.
macro_rules! memory_json {
    ($($field:ident),* $(,)?) => {
        impl From<&MemoryStats> for MemoryJson {
            fn from(m: &MemoryStats) -> Self {
                Self { $($field: m.$field),* }
            }
        }

        impl From<&MemoryJson> for MemoryStats {
            fn from(m: &MemoryJson) -> Self {
                Self { $($field: m.$field),* }
            }
        }
    };
}

memory_json!(
    count_alloc,
    count_free,
    bytes_alloc,
    bytes_free,
    low_count,
    current_count,
    high_count,
    low_bytes,
    current_bytes,
    high_bytes,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Summary {
        let mut s = Summary {
            count: 4,
            timed_count: 4,
            sum_ps: 1 << 80,
            min_ps: 3,
            max_ps: 9,
            ..Summary::default()
        };
        s.buckets[2] = 4;
        s.statement = StatementFigures {
            errors: 1,
            warnings: 2,
            rows_affected: 3,
            rows_sent: 4,
            rows_examined: 5,
            cpu_time_ps: 6_000_000,
            cancelled: 2,
            digest: 0,
        };
        s
    }

    #[test]
    fn a_summary_round_trips_with_every_statement_figure() {
        let text = serde_json::to_string(&SummaryJson::of(&sample())).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["cpu_time_ps"], 6_000_000, "flat, beside the others");
        assert_eq!(v["cancelled"], 2);
        assert_eq!(v["rows_examined"], 5);
        let back: SummaryJson = serde_json::from_str(&text).unwrap();
        assert_eq!(back.get("statement/t/q").unwrap(), sample());
        // The scale too; a file written before layout 8.0 has none: the
        // wait scale.
        let long = Summary {
            scale: BucketScale::Long,
            ..sample()
        };
        let text = serde_json::to_string(&SummaryJson::of(&long)).unwrap();
        assert!(text.contains(r#""bucket_scale":"long""#), "{text}");
        let back: SummaryJson = serde_json::from_str(&text).unwrap();
        assert_eq!(back.get("statement/t/q").unwrap(), long);
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        old.as_object_mut().unwrap().remove("bucket_scale");
        let back: SummaryJson = serde_json::from_value(old).unwrap();
        assert_eq!(back.get("statement/t/q").unwrap().scale, BucketScale::Short);
    }

    /// A file class's figures by I/O mode round-trip; a summary without
    /// any writes no `io` (and an older file, which has none, loads as
    /// zero).
    #[test]
    fn io_figures_round_trip_and_are_left_out_when_zero() {
        let s = Summary {
            count: 6,
            bytes: 700,
            io: IoFigures {
                count: [2, 3, 1],
                sum_ns: [10, 20, 5_000_000],
                bytes: [300, 400],
            },
            ..Summary::default()
        };
        let text = serde_json::to_string(&SummaryJson::of(&s)).unwrap();
        let back: SummaryJson = serde_json::from_str(&text).unwrap();
        assert_eq!(back.get("wait/io/file/t/wal").unwrap(), s);
        let plain = serde_json::to_string(&SummaryJson::of(&sample())).unwrap();
        assert!(!plain.contains("\"io\""), "{plain}");
        let back: SummaryJson = serde_json::from_str(&plain).unwrap();
        assert_eq!(back.get("statement/t/q").unwrap().io, IoFigures::ZERO);
    }

    /// A file of an agent from before `SUM_CPU_TIME` and `COUNT_CANCELLED`
    /// loads, with both zero.
    #[test]
    fn a_summary_without_cpu_time_and_cancellations_loads() {
        let mut v = serde_json::to_value(SummaryJson::of(&sample())).unwrap();
        let m = v.as_object_mut().unwrap();
        m.remove("cpu_time_ps").unwrap();
        m.remove("cancelled").unwrap();
        let old: SummaryJson = serde_json::from_value(v).unwrap();
        let s = old.get("statement/t/q").unwrap();
        let mut want = sample();
        want.statement.cpu_time_ps = 0;
        want.statement.cancelled = 0;
        assert_eq!(s, want);
    }
}
