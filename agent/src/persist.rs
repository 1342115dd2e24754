//! Layer 1: the JSON forms in which the agent's own files (retired totals,
//! `TRUNCATE` baselines) keep summaries and memory statistics.

use pfs_shm_layout::layout::HISTOGRAM_BUCKETS;
use pfs_shm_layout::reader::{MemoryStats, Summary};
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

/// A [`Summary`] in the agent's JSON files.
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
    errors: u64,
    warnings: u64,
    rows_affected: u64,
    rows_sent: u64,
    rows_examined: u64,
}

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
        let f = &s.statement;
        Self {
            count: s.count,
            timed_count: s.timed_count,
            sum_ps: s.sum_ps.to_string(),
            min_ps: s.min_ps,
            max_ps: s.max_ps,
            bytes: s.bytes,
            buckets: s.buckets.to_vec(),
            errors: f.errors,
            warnings: f.warnings,
            rows_affected: f.rows_affected,
            rows_sent: f.rows_sent,
            rows_examined: f.rows_examined,
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
            ..Summary::default()
        };
        s.buckets.copy_from_slice(&self.buckets);
        let f = &mut s.statement;
        f.errors = self.errors;
        f.warnings = self.warnings;
        f.rows_affected = self.rows_affected;
        f.rows_sent = self.rows_sent;
        f.rows_examined = self.rows_examined;
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
