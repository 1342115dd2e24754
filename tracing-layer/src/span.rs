//! Layer 3. What the layer keeps in a span's extensions: a statement
//! span's context, statement, field values and figures, or a stage span's
//! class and statement (a statement span's state is boxed, and the boxes
//! of closed spans are reused by the next ones on the same thread); and
//! the visitors that read span and event fields into them.

use std::cell::RefCell;
use std::fmt::{self, Write as _};

use pfs_client::task::TaskContext;
use pfs_client::{StageClass, TaskStatement};
use tracing_core::field::{Field, Visit};

use crate::callsite::FieldUse;
use crate::rules::{Figure, MAX_VALUE_FIELDS, StatementRule};

/// The layer's data in a span's extensions: one type, so that a hook finds
/// it, or learns the span is not the layer's, with one lookup.
#[derive(Debug)]
pub(crate) enum PfsSpan {
    /// Boxed: the registry boxes the extension too, and a statement is
    /// large (its statement keeps its `SQL_TEXT`). The box comes from, and
    /// goes back to, a per-thread pool ([`StatementSpan::boxed`],
    /// [`StatementSpan::recycle`]), so the registry moves a few words, not
    /// the statement, and a statement span costs no allocation of ours.
    Statement(Box<StatementSpan>),
    Stage(StageSpan),
}

/// A statement span: a logical thread of its own.
#[derive(Debug)]
pub(crate) struct StatementSpan {
    /// Index of its rule.
    pub(crate) rule: usize,
    /// Its context: swapped in while the span is entered.
    pub(crate) task: TaskContext,
    /// The statement, from its first enter (in the context) to its close.
    pub(crate) stmt: Option<TaskStatement>,
    pub(crate) values: Values,
    pub(crate) figures: Figures,
    /// The stage span whose stage was entered last in this statement (0:
    /// none, or it ended).
    pub(crate) open_stage: u64,
    /// The digest text, when it is the class name (the rule's digest
    /// template is its class template) rendered as the statement started.
    pub(crate) digest: String,
    /// The digest text was set when the statement started, from `digest`,
    /// and no value was recorded since: the close does not render it again.
    pub(crate) digest_set: bool,
    /// `SQL_TEXT` was rendered when the statement started (so that a
    /// running statement shows it) and no value was recorded since: the
    /// close does not render it again.
    pub(crate) text_set: bool,
}

/// The most boxes of closed statement spans a thread keeps for reuse.
const SPARE_BOXES: usize = 16;

thread_local! {
    /// Boxes of statement spans closed on this thread, reset, for the
    /// next statement spans created here (boxes, not values: each is
    /// handed to a span as it is).
    #[allow(clippy::vec_box)]
    static SPARE: RefCell<Vec<Box<StatementSpan>>> = const { RefCell::new(Vec::new()) };
}

impl StatementSpan {
    fn new(rule: usize) -> Self {
        Self {
            rule,
            task: TaskContext::new(),
            stmt: None,
            values: Values::default(),
            figures: Figures::default(),
            open_stage: 0,
            digest: String::new(),
            digest_set: false,
            text_set: false,
        }
    }

    /// A new statement span of rule `rule`, boxed: a spare box of this
    /// thread's if there is one (reset when it was recycled), else a new one.
    #[inline]
    pub(crate) fn boxed(rule: usize) -> Box<Self> {
        let spare = SPARE.try_with(|s| s.try_borrow_mut().ok()?.pop());
        match spare {
            Ok(Some(mut b)) => {
                b.rule = rule;
                b
            }
            _ => Box::new(Self::new(rule)),
        }
    }

    /// Drops the state of a closed statement span (its statement, if any,
    /// ends here as it would when dropped) and keeps the box, reset, for
    /// [`StatementSpan::boxed`].
    #[inline]
    pub(crate) fn recycle(mut self: Box<Self>) {
        self.stmt = None;
        self.task = TaskContext::new();
        self.values.clear();
        self.figures = Figures::default();
        self.open_stage = 0;
        if self.digest.capacity() > VALUE_BYTES {
            self.digest = String::new();
        } else {
            self.digest.clear();
        }
        self.digest_set = false;
        self.text_set = false;
        let _ = SPARE.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut()
                && s.len() < SPARE_BOXES
            {
                s.push(self);
            }
        });
    }
}

/// A stage span inside a statement span.
#[derive(Debug)]
pub(crate) struct StageSpan {
    /// The statement span it belongs to (the closest one above it).
    pub(crate) statement: u64,
    pub(crate) class: StageClass,
    /// Entered once already (only the first enter can start the stage).
    pub(crate) entered: bool,
}

/// The values of the fields a rule's templates refer to, by slot, as text.
#[derive(Debug)]
pub(crate) struct Values {
    buf: String,
    /// Byte range in `buf` by slot; `ABSENT` start: no value.
    at: [(u32, u32); MAX_VALUE_FIELDS],
}

const ABSENT: u32 = u32::MAX;

impl Default for Values {
    fn default() -> Self {
        Self {
            buf: String::new(),
            at: [(ABSENT, 0); MAX_VALUE_FIELDS],
        }
    }
}

impl Values {
    /// No value, keeping the buffer (unless a long one).
    fn clear(&mut self) {
        if self.buf.capacity() > 8 * VALUE_BYTES {
            self.buf = String::new();
        } else {
            self.buf.clear();
        }
        self.at = [(ABSENT, 0); MAX_VALUE_FIELDS];
    }

    /// The value of `slot`, if recorded.
    #[inline]
    pub(crate) fn get(&self, slot: usize) -> Option<&str> {
        let (a, b) = *self.at.get(slot)?;
        (a != ABSENT).then(|| &self.buf[a as usize..b as usize])
    }

    /// Sets `slot` to what `write` appends, cut to [`VALUE_BYTES`] on a
    /// character boundary. A value recorded again replaces the old one
    /// (the buffer is compacted when replaced values pile up).
    fn set_with(&mut self, slot: u8, write: impl FnOnce(&mut String)) {
        let slot = slot as usize;
        if slot >= MAX_VALUE_FIELDS {
            return;
        }
        let (a, b) = self.at[slot];
        if a != ABSENT && b as usize == self.buf.len() {
            // The last value written: overwrite it in place.
            self.buf.truncate(a as usize);
        } else if self.buf.len() > 4 * VALUE_BYTES {
            self.compact();
        }
        let start = self.buf.len();
        write(&mut self.buf);
        if self.buf.len() - start > VALUE_BYTES {
            let end = self.buf.floor_char_boundary(start + VALUE_BYTES);
            self.buf.truncate(end);
        }
        self.at[slot] = (start as u32, self.buf.len() as u32);
    }

    /// Keeps only the current values in `buf`.
    #[cold]
    fn compact(&mut self) {
        let mut buf = String::with_capacity(self.buf.len());
        for at in &mut self.at {
            if at.0 != ABSENT {
                let start = buf.len();
                buf.push_str(&self.buf[at.0 as usize..at.1 as usize]);
                *at = (start as u32, buf.len() as u32);
            }
        }
        self.buf = buf;
    }
}

/// The longest value kept per field, in bytes: more than a class name
/// (112) or `SQL_TEXT` (200) can hold.
pub(crate) const VALUE_BYTES: usize = 256;

/// A statement's figures, gathered from span and event fields and
/// written into the statement when it ends.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Figures {
    pub(crate) status: Option<i64>,
    pub(crate) failed: bool,
    pub(crate) errors: u64,
    pub(crate) warnings: u64,
    pub(crate) rows_sent: Option<u64>,
    pub(crate) rows_affected: Option<u64>,
    pub(crate) rows_examined: Option<u64>,
    /// The response was cut short (`Figure::Cut`).
    pub(crate) cut: bool,
}

/// A field value, as a figure sees it.
#[derive(Clone, Copy)]
enum Num<'a> {
    Int(i128),
    Float(f64),
    Bool(bool),
    Text(&'a str),
    /// A value recorded with `?` or `%` (`Debug`, `Display`: an error, an
    /// enum): read as a number for a status or rows, but an errors or
    /// warnings field counts it once, whatever it says (`#[instrument(err)]`
    /// records `error = %e`, and an error code `404` is one error).
    Shown(&'a str),
}

impl Num<'_> {
    fn int(self) -> Option<i128> {
        match self {
            Num::Int(i) => Some(i),
            Num::Float(f) if f.is_finite() => Some(f as i128),
            Num::Text(t) | Num::Shown(t) => t.trim().parse().ok(),
            Num::Float(_) | Num::Bool(_) => None,
        }
    }

    /// How much an errors or warnings field adds.
    fn count(self) -> u64 {
        match self {
            Num::Bool(b) => u64::from(b),
            Num::Shown(t) => u64::from(!t.is_empty()),
            Num::Text(t) if t.trim().parse::<i128>().is_err() => u64::from(!t.is_empty()),
            n => n.int().map_or(0, |i| i.clamp(0, u64::MAX as i128) as u64),
        }
    }

    fn rows(self) -> Option<u64> {
        self.int().and_then(|i| u64::try_from(i).ok())
    }
}

impl Figures {
    fn record(&mut self, kind: Figure, v: Num<'_>) {
        match kind {
            Figure::Status => {
                if let Some(s) = v.int() {
                    self.status = Some(s.clamp(i64::MIN as i128, i64::MAX as i128) as i64);
                }
            }
            Figure::Failure => self.failed = true,
            Figure::Errors => self.errors = self.errors.saturating_add(v.count()),
            Figure::Warnings => self.warnings = self.warnings.saturating_add(v.count()),
            Figure::RowsSent => self.rows_sent = v.rows().or(self.rows_sent),
            Figure::RowsAffected => self.rows_affected = v.rows().or(self.rows_affected),
            Figure::RowsExamined => self.rows_examined = v.rows().or(self.rows_examined),
            Figure::Cut => self.cut |= v.count() > 0,
        }
    }

    /// Whether a status or failure was recorded.
    pub(crate) fn completed(&self) -> bool {
        self.status.is_some() || self.failed
    }

    /// Whether a status was recorded.
    pub(crate) fn has_status(&self) -> bool {
        self.status.is_some()
    }

    /// Writes the figures into `stmt`, as `rule` reads them. How the span
    /// closes: `end.panicking`, while its thread unwinds (a failure: one
    /// error unless some were counted, as `pfs-client` counts any
    /// statement a panic ends);
    /// `end.cancelling`, in the drop of a future that did not
    /// complete (`pfs_client::task::cancelling`: cancelled, unless a
    /// status or failure was recorded). A response cut short (`cut`) is
    /// cancelled whatever its status.
    pub(crate) fn apply(&self, stmt: &mut TaskStatement, rule: &StatementRule, end: Closing) {
        let failed = self.failed
            || self.status.is_some_and(|s| s >= rule.error_status)
            || (end.panicking && self.errors == 0);
        let errors = self.errors.saturating_add(u64::from(failed));
        let unfinished =
            !self.completed() && (end.cancelling || (rule.completes() && !end.completion_unseen));
        if !end.panicking && (self.cut || unfinished) {
            stmt.mark_cancelled();
        }
        if errors > 0 {
            stmt.add_errors(errors);
        }
        if self.warnings > 0 {
            stmt.add_warnings(self.warnings);
        }
        if let Some(n) = self.rows_sent {
            stmt.set_rows_sent(n);
        }
        if let Some(n) = self.rows_affected {
            stmt.set_rows_affected(n);
        }
        if let Some(n) = self.rows_examined {
            stmt.set_rows_examined(n);
        }
    }
}

/// How a statement span closes, for [`Figures::apply`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Closing {
    /// Its thread is unwinding a panic.
    pub(crate) panicking: bool,
    /// A future is being dropped before it completed, with the
    /// cancelling mark (`pfs_client::task::cancelling`).
    pub(crate) cancelling: bool,
    /// The rule's completion could not have been seen (its event is
    /// filtered out for everyone): not cancelled for want of one.
    pub(crate) completion_unseen: bool,
}

impl Closing {
    /// How a span closing now on this thread closes.
    pub(crate) fn now() -> Self {
        Self {
            panicking: std::thread::panicking(),
            cancelling: pfs_client::task::cancelling(),
            completion_unseen: false,
        }
    }
}

/// Reads a statement span's fields (at creation and `Span::record`).
pub(crate) struct SpanVisitor<'a> {
    pub(crate) uses: &'a [FieldUse],
    pub(crate) values: &'a mut Values,
    pub(crate) figures: &'a mut Figures,
}

impl SpanVisitor<'_> {
    #[inline]
    fn field(&mut self, field: &Field, num: Num<'_>, text: impl FnOnce(&mut String)) {
        let Some(u) = self.uses.get(field.index()) else {
            return;
        };
        if let Some(kind) = u.figure {
            self.figures.record(kind, num);
        }
        if let Some(slot) = u.value {
            self.values.set_with(slot, text);
        }
    }

    fn wanted(&self, field: &Field) -> bool {
        self.uses
            .get(field.index())
            .is_some_and(|u| u.value.is_some() || u.figure.is_some())
    }
}

impl Visit for SpanVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, Num::Text(value), |b| b.push_str(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, Num::Int(value.into()), |b| {
            let _ = write!(b, "{value}");
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, Num::Int(value.into()), |b| {
            let _ = write!(b, "{value}");
        });
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.field(field, Num::Int(value), |b| {
            let _ = write!(b, "{value}");
        });
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        let n = i128::try_from(value).unwrap_or(i128::MAX);
        self.field(field, Num::Int(n), |b| {
            let _ = write!(b, "{value}");
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field, Num::Float(value), |b| {
            let _ = write!(b, "{value}");
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, Num::Bool(value), |b| {
            let _ = write!(b, "{value}");
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.wanted(field) {
            return;
        }
        let mut small = Small::default();
        let num = if self.uses[field.index()].figure.is_some() {
            let _ = write!(small, "{value:?}");
            Num::Shown(small.as_str())
        } else {
            Num::Shown("")
        };
        self.field(field, num, |b| {
            let _ = write!(b, "{value:?}");
        });
    }
}

/// Reads the fields of an event inside a statement.
pub(crate) struct EventVisitor<'a> {
    /// By field index of the event's callsite.
    pub(crate) uses: &'a [Option<Figure>],
    pub(crate) figures: &'a mut Figures,
}

impl EventVisitor<'_> {
    #[inline]
    fn field(&mut self, field: &Field, num: Num<'_>) {
        if let Some(Some(kind)) = self.uses.get(field.index()) {
            self.figures.record(*kind, num);
        }
    }
}

impl Visit for EventVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, Num::Text(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, Num::Int(value.into()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, Num::Int(value.into()));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.field(field, Num::Int(value));
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.field(field, Num::Int(i128::try_from(value).unwrap_or(i128::MAX)));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field, Num::Float(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, Num::Bool(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if let Some(Some(_)) = self.uses.get(field.index()) {
            let mut small = Small::default();
            let _ = write!(small, "{value:?}");
            self.field(field, Num::Shown(small.as_str()));
        }
    }
}

/// A short text formatted on the stack (a figure's value is a number:
/// a longer text reads as `?`, not a number).
struct Small {
    buf: [u8; 40],
    len: usize,
    cut: bool,
}

impl Default for Small {
    fn default() -> Self {
        Self {
            buf: [0; 40],
            len: 0,
            cut: false,
        }
    }
}

impl Small {
    fn as_str(&self) -> &str {
        if self.cut {
            return "?";
        }
        // Only whole characters are copied in.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("?")
    }
}

impl fmt::Write for Small {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.cut || self.len + s.len() > self.buf.len() {
            self.cut = true;
        } else {
            self.buf[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
            self.len += s.len();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_from_values() {
        let mut f = Figures::default();
        f.record(Figure::Status, Num::Int(503));
        f.record(Figure::Errors, Num::Bool(true));
        f.record(Figure::Errors, Num::Text("2"));
        f.record(Figure::Errors, Num::Text("timeout"));
        // `error = %e` of an error that displays as a number: one error.
        f.record(Figure::Errors, Num::Shown("404"));
        f.record(Figure::Errors, Num::Shown("0"));
        f.record(Figure::Warnings, Num::Int(-3));
        f.record(Figure::RowsAffected, Num::Shown("5")); // `rows = ?n`
        f.record(Figure::RowsSent, Num::Text(" 12 "));
        f.record(Figure::RowsSent, Num::Text("many")); // ignored
        f.record(Figure::RowsExamined, Num::Float(7.9));
        f.record(Figure::Cut, Num::Bool(false)); // not cut
        assert_eq!(
            f,
            Figures {
                status: Some(503),
                failed: false,
                errors: 6,
                warnings: 0,
                rows_sent: Some(12),
                rows_affected: Some(5),
                rows_examined: Some(7),
                cut: false,
            }
        );
        assert!(f.completed());
        f.record(Figure::Cut, Num::Bool(true));
        assert!(f.cut, "cut short, whatever the status");
    }

    #[test]
    fn small_text_cuts_long_values() {
        let mut s = Small::default();
        let _ = write!(s, "{}", "é".repeat(30));
        assert_eq!(s.as_str(), "?");
        let mut s = Small::default();
        let _ = write!(s, "{:?}", 404);
        assert_eq!(s.as_str(), "404");
    }

    #[test]
    fn values_by_slot() {
        let mut v = Values::default();
        v.set_with(1, |b| b.push_str("GET"));
        v.set_with(0, |b| b.push_str("/a"));
        v.set_with(0, |b| b.push_str("/b"));
        v.set_with(200, |b| b.push_str("ignored"));
        assert_eq!(
            (v.get(0), v.get(1), v.get(2)),
            (Some("/b"), Some("GET"), None)
        );
        assert_eq!(v.buf, "GET/b", "the last value is overwritten in place");
        // Recorded again and again: the buffer stays bounded.
        for i in 0..10_000 {
            v.set_with(1, |b| b.push_str(if i % 2 == 0 { "POST" } else { "PUT" }));
            v.set_with(0, |b| b.push_str(&"é".repeat(200)));
        }
        assert!(v.buf.len() <= 6 * VALUE_BYTES, "{}", v.buf.len());
        assert_eq!(v.get(1), Some("PUT"));
        assert_eq!(v.get(0), Some("é".repeat(VALUE_BYTES / 2).as_str()));
    }
}
