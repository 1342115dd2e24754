//! Tables as they are handed out: rows of [`Cell`]s given to a [`Sink`]
//! one at a time, written as JSON while they are made ([`JsonSink`]) or
//! collected into a [`Table`] (for the `query` command's text).

use serde::ser::{Serialize, Serializer};
use serde_json::{Map, Value, json};

/// One cell of a table row, borrowed from the snapshot where it can be.
/// Rows are handed to a [`Sink`] as cells, one row at a time, so that a
/// table is never held whole unless a caller collects it ([`build`]). A
/// cell serialises exactly as the `serde_json::Value` it stands for
/// ([`Cell::to_value`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Cell<'a> {
    /// SQL NULL: JSON `null`.
    Null,
    /// An unsigned number.
    U64(u64),
    /// A signed number.
    I64(i64),
    /// Picoseconds: an integer when it fits in 64 bits, else (beyond
    /// about 213 days: an idle instrument's sum over many threads) a
    /// floating-point number, to 16 significant digits: a number either
    /// way, for clients that read the column as one.
    Ps(u128),
    /// Text borrowed from the snapshot.
    Str(&'a str),
    /// Text made for this cell.
    Owned(String),
    /// A fraction (`bucket_quantile`): a JSON number, 6 decimals as
    /// MySQL's `DECIMAL(7,6)`.
    F64(f64),
}

impl Cell<'_> {
    /// The JSON value of this cell.
    pub fn to_value(&self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::U64(v) => (*v).into(),
            Cell::I64(v) => (*v).into(),
            Cell::Ps(v) => ps(*v),
            Cell::Str(s) => (*s).into(),
            Cell::Owned(s) => s.as_str().into(),
            Cell::F64(v) => {
                serde_json::Number::from_f64(six_decimals(*v)).map_or(Value::Null, Value::Number)
            }
        }
    }
}

impl Serialize for Cell<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        match self {
            Cell::Null => ser.serialize_unit(),
            Cell::U64(v) => ser.serialize_u64(*v),
            Cell::I64(v) => ser.serialize_i64(*v),
            Cell::Ps(v) => match u64::try_from(*v) {
                Ok(v) => ser.serialize_u64(v),
                Err(_) => ser.serialize_f64(*v as f64),
            },
            Cell::Str(s) => ser.serialize_str(s),
            Cell::Owned(s) => ser.serialize_str(s),
            Cell::F64(v) if v.is_finite() => ser.serialize_f64(six_decimals(*v)),
            Cell::F64(_) => ser.serialize_unit(),
        }
    }
}

/// `v` rounded to 6 decimals.
fn six_decimals(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

macro_rules! cell_from {
    ($variant:ident: $($t:ty),*) => {$(
        impl From<$t> for Cell<'_> {
            fn from(v: $t) -> Self {
                Cell::$variant(v.into())
            }
        }
    )*};
}
cell_from!(U64: u64, u32, u8);
cell_from!(I64: i64);
cell_from!(Owned: String);

impl From<usize> for Cell<'_> {
    fn from(v: usize) -> Self {
        Cell::U64(v as u64)
    }
}

impl<'a> From<&'a str> for Cell<'a> {
    fn from(v: &'a str) -> Self {
        Cell::Str(v)
    }
}

impl<'a, T: Into<Cell<'a>>> From<Option<T>> for Cell<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Cell::Null, Into::into)
    }
}

/// Receives a table as it is built: [`Sink::columns`] once, before any
/// row, then [`Sink::row`] for each row (as long as the columns).
pub trait Sink {
    /// The table's column names.
    fn columns(&mut self, columns: &[&'static str]);
    /// One row, cells in column order.
    fn row(&mut self, row: &[Cell<'_>]);
}

/// Collects a [`Table`].
pub(super) struct Collect(pub(super) Table);

impl Sink for Collect {
    fn columns(&mut self, columns: &[&'static str]) {
        self.0.columns = columns.to_vec();
    }
    fn row(&mut self, row: &[Cell<'_>]) {
        self.0.rows.push(row.iter().map(Cell::to_value).collect());
    }
}

/// Writes a table as the JSON of [`Table::to_json`] (compact), row by row:
/// each row is made in `row` (its keys written once, in `keys`) and handed
/// to `out` in one write.
pub(super) struct JsonSink<'w> {
    out: &'w mut dyn std::io::Write,
    name: &'w str,
    /// Per column: `"name":` as serde_json writes a key, with the `{` or
    /// `,` before it.
    keys: Vec<Vec<u8>>,
    row: Vec<u8>,
    rows: usize,
    error: Option<std::io::Error>,
}

impl<'w> JsonSink<'w> {
    /// A sink writing table `name` to `out`.
    pub(super) fn new(out: &'w mut dyn std::io::Write, name: &'w str) -> Self {
        Self {
            out,
            name,
            keys: Vec::new(),
            row: Vec::with_capacity(1024),
            rows: 0,
            error: None,
        }
    }

    /// Ends the JSON (after every row was handed), with a `"warning"`
    /// member after the rows if one is given, or reports the first write
    /// that failed.
    pub(super) fn finish(self, warning: Option<&str>) -> std::io::Result<()> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut end = b"]".to_vec();
        if let Some(w) = warning {
            end.extend_from_slice(b",\"warning\":");
            serde_json::to_writer(&mut end, w).expect("a str serialises");
        }
        end.push(b'}');
        self.out.write_all(&end)
    }
}

impl Sink for JsonSink<'_> {
    fn columns(&mut self, columns: &[&'static str]) {
        self.keys = columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut k = vec![if i == 0 { b'{' } else { b',' }];
                serde_json::to_writer(&mut k, c).expect("a str serialises");
                k.push(b':');
                k
            })
            .collect();
        if self.error.is_some() {
            return;
        }
        let out = &mut *self.out;
        let r = (|| {
            out.write_all(b"{\"table\":")?;
            serde_json::to_writer(&mut *out, self.name)?;
            out.write_all(b",\"columns\":")?;
            serde_json::to_writer(&mut *out, columns)?;
            out.write_all(b",\"rows\":[")
        })();
        self.error = r.err();
    }
    fn row(&mut self, cells: &[Cell<'_>]) {
        self.rows += 1;
        if self.error.is_some() {
            return;
        }
        let row = &mut self.row;
        row.clear();
        if self.rows > 1 {
            row.push(b',');
        }
        for (k, c) in self.keys.iter().zip(cells) {
            row.extend_from_slice(k);
            serde_json::to_writer(&mut *row, c).expect("a cell serialises");
        }
        if self.keys.is_empty() || cells.is_empty() {
            row.push(b'{');
        }
        row.push(b'}');
        self.error = self.out.write_all(row).err();
    }
}

/// A table: column names and rows of JSON values in column order.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Table name.
    pub name: String,
    /// Column names.
    pub columns: Vec<&'static str>,
    /// Rows, each as long as `columns`.
    pub rows: Vec<Vec<Value>>,
}

/// 2^64: the first value a `u64` cannot hold.
const U64_END: f64 = 18_446_744_073_709_551_616.0;

fn ps(v: u128) -> Value {
    u64::try_from(v).map_or_else(|_| Value::from(v as f64), Value::from)
}

/// A column name a [`Table`] does not have; the message lists those it has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table {table} has no column {column:?}; its columns: {columns}")]
pub struct NoSuchColumn {
    /// The table.
    pub table: String,
    /// The name asked for.
    pub column: String,
    /// Its columns, comma-separated.
    pub columns: String,
}

impl Table {
    /// The index of column `name` (any case, as SQL compares names;
    /// spaces around it do not count).
    fn column(&self, name: &str) -> Result<usize, NoSuchColumn> {
        let name = name.trim();
        self.columns
            .iter()
            .position(|c| c.eq_ignore_ascii_case(name))
            .ok_or_else(|| NoSuchColumn {
                table: self.name.clone(),
                column: name.to_string(),
                columns: self.columns.join(", "),
            })
    }

    /// Sorts the rows by column `name`, as SQL's `ORDER BY name [DESC]`:
    /// numbers by value (picoseconds past 64 bits too), text by its
    /// bytes, `NULL` first (last with `desc`); rows that tie keep their
    /// order.
    pub fn order_by(&mut self, name: &str, desc: bool) -> Result<(), NoSuchColumn> {
        let i = self.column(name)?;
        self.rows.sort_by(|a, b| {
            let o = compare_cells(&a[i], &b[i]);
            if desc { o.reverse() } else { o }
        });
        Ok(())
    }

    /// Keeps the rows whose column `name` reads `value`, as MySQL's
    /// `WHERE name = value` compares: text regardless of ASCII case (as
    /// MySQL's default collation: `enabled=yes`, `operation=LOCK`),
    /// numbers by value (`1.000000`, as the text table shows a
    /// quantile, is `1`), `NULL` for an empty cell.
    pub fn filter(&mut self, name: &str, value: &str) -> Result<(), NoSuchColumn> {
        let i = self.column(name)?;
        let value = value.trim();
        self.rows.retain(|r| match &r[i] {
            Value::Null => value.eq_ignore_ascii_case("NULL"),
            Value::String(s) => s.eq_ignore_ascii_case(value),
            Value::Number(n) => number_is(n, value),
            Value::Bool(b) => b.to_string().eq_ignore_ascii_case(value),
            // (No table has a list or an object in a cell.)
            Value::Array(_) | Value::Object(_) => false,
        });
        Ok(())
    }

    /// Keeps only columns `names`, in that order (`SELECT names`; spaces
    /// around a name do not count, and a column named twice is kept once).
    pub fn select(&mut self, names: &[String]) -> Result<(), NoSuchColumn> {
        let mut keep = Vec::new();
        for n in names {
            let i = self.column(n)?;
            if !keep.contains(&i) {
                keep.push(i);
            }
        }
        self.columns = keep.iter().map(|&i| self.columns[i]).collect();
        for row in &mut self.rows {
            *row = keep.iter().map(|&i| row[i].clone()).collect();
        }
        Ok(())
    }

    /// The JSON form served by the API: `{"table", "columns", "rows": [{..}]}`.
    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut m = Map::new();
                for (c, v) in self.columns.iter().zip(r) {
                    m.insert((*c).to_string(), v.clone());
                }
                Value::Object(m)
            })
            .collect();
        json!({ "table": self.name, "columns": self.columns, "rows": rows })
    }

    /// An aligned text table, as the `mysql` client prints one.
    pub fn to_text(&self) -> String {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
        t.set_header(self.columns.iter().map(|c| c.to_uppercase()));
        for r in &self.rows {
            t.add_row(r.iter().map(shown));
        }
        format!("{t}\n{}", self.rows_in_set())
    }

    /// The table one cell per line, each row under a `*** N. row ***`
    /// header, the column names right-aligned, as MySQL's client prints
    /// a query ended by `\G`: for tables too wide for a terminal.
    ///
    /// ```
    /// use pfs_agent::tables::Table;
    /// let t = Table {
    ///     name: "t".into(),
    ///     columns: vec!["event_name", "count_star"],
    ///     rows: vec![vec!["wait/io/file/kv/wal".into(), 7.into()]],
    /// };
    /// assert_eq!(
    ///     t.to_vertical(),
    ///     "*************************** 1. row ***************************\n\
    ///      EVENT_NAME: wait/io/file/kv/wal\n\
    ///      COUNT_STAR: 7\n\
    ///      1 row in set\n"
    /// );
    /// ```
    pub fn to_vertical(&self) -> String {
        let width = self.columns.iter().map(|c| c.len()).max().unwrap_or(0);
        let stars = "*".repeat(27);
        let mut out = String::new();
        for (i, r) in self.rows.iter().enumerate() {
            out.push_str(&format!("{stars} {}. row {stars}\n", i + 1));
            for (c, v) in self.columns.iter().zip(r) {
                let name = c.to_uppercase();
                out.push_str(&format!("{name:>width$}: {}\n", shown(v)));
            }
        }
        out.push_str(&self.rows_in_set());
        out
    }

    /// `N rows in set`, as MySQL's client ends a result.
    fn rows_in_set(&self) -> String {
        let n = self.rows.len();
        format!("{n} row{} in set\n", if n == 1 { "" } else { "s" })
    }
}

/// A cell as the text formats show it.
fn shown(v: &Value) -> String {
    match v {
        Value::Null => "NULL".to_string(),
        // Segment text (a statement's, a thread's name) is the writer's
        // choice: shown with its control characters escaped, never sent
        // to the operator's terminal as is.
        Value::String(s) => crate::util::shown::printable(s).into_owned(),
        // A picosecond cell beyond 64 bits ([`Cell::Ps`]): a whole number.
        Value::Number(n) if n.as_f64().is_some_and(|f| f >= U64_END) => {
            format!("{:.0}", n.as_f64().unwrap_or(0.0))
        }
        // A fraction (`bucket_quantile`), as MySQL's DECIMAL(7,6).
        Value::Number(n) if n.is_f64() => format!("{:.6}", n.as_f64().unwrap_or(0.0)),
        other => other.to_string(),
    }
}

/// Whether the JSON number `n` equals the number `text` (integers
/// exactly, others as `f64`); `false` if `text` is not a number.
fn number_is(n: &serde_json::Number, text: &str) -> bool {
    if let (Some(a), Ok(b)) = (n.as_u64(), text.parse::<u64>()) {
        return a == b;
    }
    if let (Some(a), Ok(b)) = (n.as_i64(), text.parse::<i64>()) {
        return a == b;
    }
    matches!((n.as_f64(), text.parse::<f64>()), (Some(a), Ok(b)) if a == b)
}

/// Two cells as `ORDER BY` compares them: `NULL` first, then numbers by
/// value (a picosecond count past 64 bits is decimal text: by value too),
/// then other text by its bytes.
fn compare_cells(a: &Value, b: &Value) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    fn number(v: &Value) -> Option<f64> {
        match v {
            Value::Number(n) => n.as_f64(),
            Value::String(s) if !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) => {
                s.parse::<f64>().ok()
            }
            _ => None,
        }
    }
    match (a, b) {
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Less,
        (_, Value::Null) => Ordering::Greater,
        _ => match (number(a), number(b)) {
            // Integers compare exactly where both are.
            (Some(x), Some(y)) => match (a.as_u64(), b.as_u64()) {
                (Some(p), Some(q)) => p.cmp(&q),
                _ => x.total_cmp(&y),
            },
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => a.to_string().cmp(&b.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_order_and_columns_select_as_sql_does() {
        let mut t = Table {
            name: "t".into(),
            columns: vec!["event_name", "timer_wait"],
            rows: vec![
                vec![Value::from("b"), Value::from(20u64)],
                vec![Value::from("a"), Value::Null],
                vec![Value::from("c"), Value::from("18446744073709551616")],
                vec![Value::from("d"), Value::from(3u64)],
            ],
        };
        t.order_by("TIMER_WAIT", true).unwrap();
        let names = |t: &Table| t.rows.iter().map(|r| r[0].clone()).collect::<Vec<_>>();
        assert_eq!(names(&t), ["c", "b", "d", "a"]);
        t.order_by("timer_wait", false).unwrap();
        assert_eq!(names(&t), ["a", "d", "b", "c"]);
        t.order_by("event_name", true).unwrap();
        assert_eq!(names(&t), ["d", "c", "b", "a"]);
        let mut f = t.clone();
        f.filter("timer_wait", "NULL").unwrap();
        assert_eq!(names(&f), ["a"]);
        let mut f = t.clone();
        f.filter("timer_wait", "20").unwrap();
        f.filter("event_name", "b").unwrap();
        assert_eq!(names(&f), ["b"]);
        // As MySQL compares: text regardless of case, numbers by value.
        let mut f = t.clone();
        f.filter("event_name", "B").unwrap();
        f.filter("timer_wait", "20.000000").unwrap();
        assert_eq!(names(&f), ["b"]);
        let mut f = t.clone();
        f.filter("timer_wait", "18446744073709551616").unwrap();
        assert_eq!(names(&f), ["c"]);
        let mut f = t.clone();
        f.filter("timer_wait", "2O").unwrap();
        assert!(f.rows.is_empty());
        // Spaces around a column's name do not count (`col = value`).
        let mut f = t.clone();
        f.filter(" event_name ", "b").unwrap();
        assert_eq!(names(&f), ["b"]);
        t.select(&[
            "timer_wait".into(),
            " event_name".into(),
            "timer_wait".into(),
        ])
        .unwrap();
        assert_eq!(t.columns, ["timer_wait", "event_name"]);
        assert_eq!(t.rows[0], [Value::from(3u64), Value::from("d")]);
        let e = t.order_by("nope", false).unwrap_err().to_string();
        assert!(
            e.contains("no column \"nope\"") && e.contains("timer_wait, event_name"),
            "{e}"
        );
    }

    /// A writer's text with terminal escapes and a newline reaches the
    /// text table escaped: one line per row, no escape sequence.
    #[test]
    fn text_tables_escape_control_characters() {
        let t = Table {
            name: "t".into(),
            columns: vec!["sql_text", "name"],
            rows: vec![vec![
                Value::from("SELECT 1\u{1b}[2J\u{1b}]52;c;eA==\u{7}"),
                Value::from("svc\nERROR forged"),
            ]],
        };
        let text = t.to_text();
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text}"
        );
        assert!(text.contains("SELECT 1\\u{1b}[2J"), "{text}");
        assert!(text.contains("svc\\nERROR forged"), "{text}");
    }

    #[test]
    fn cells_serialise_as_their_values() {
        for c in [
            Cell::Null,
            Cell::U64(u64::MAX),
            Cell::I64(-5),
            Cell::I64(5),
            Cell::Ps(7),
            Cell::Ps(u128::from(u64::MAX) + 1),
            Cell::Str("a\"\\\u{0}é"),
            Cell::Owned("x".into()),
        ] {
            assert_eq!(serde_json::to_string(&c).unwrap(), c.to_value().to_string());
        }
        // Beyond 64 bits, still a number, shown whole in the text table.
        let big = Cell::Ps(u128::from(u64::MAX) * 3).to_value();
        assert_eq!(shown(&big), "55340232221128654848");
        assert_eq!(shown(&Value::from(1.0)), "1.000000");
        assert_eq!(big.as_f64(), Some(u64::MAX as f64 * 3.0));
        assert_eq!(
            serde_json::to_string(&Cell::Ps(u128::from(u64::MAX) * 3)).unwrap(),
            big.to_string()
        );
    }
}
