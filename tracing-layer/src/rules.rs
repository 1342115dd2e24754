//! Layer 1. The rules: which spans are statements and which are stages
//! ([`SpanMatch`]), how their classes are named, and which fields become
//! `SQL_TEXT`, `DIGEST`, rows, errors and the response status
//! ([`StatementRule`], [`StageRule`]); and the defaults for HTTP servers.
//! Rules are evaluated once per callsite, never per span.

use std::fmt;
use std::sync::Arc;

use pfs_shm_layout::ClassKind;
use tracing_core::Metadata;

use crate::template::Template;

/// Which spans a rule applies to: a test on a callsite's static
/// [`Metadata`] (name, target, level, field names), run once per callsite.
///
/// ```
/// use pfs_tracing::SpanMatch;
///
/// // Spans named `request` that have a `method` field.
/// let m = SpanMatch::name("request").and_field("method");
/// // Any span of the `my_app::db` module and below.
/// let db = SpanMatch::target_prefix("my_app::db");
/// // Anything else you can tell from the metadata.
/// let info = SpanMatch::custom(|meta| *meta.level() <= tracing::Level::INFO);
/// # let _ = (m, db, info);
/// ```
#[derive(Clone)]
pub struct SpanMatch {
    test: Arc<dyn Fn(&Metadata<'_>) -> bool + Send + Sync>,
}

impl fmt::Debug for SpanMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SpanMatch(..)")
    }
}

impl SpanMatch {
    /// Spans for which `test` returns true.
    pub fn custom(test: impl Fn(&Metadata<'_>) -> bool + Send + Sync + 'static) -> Self {
        Self {
            test: Arc::new(test),
        }
    }

    /// Spans named `name`.
    pub fn name(name: &str) -> Self {
        let name = name.to_string();
        Self::custom(move |m| m.name() == name)
    }

    /// Spans named any of `names`.
    pub fn names(names: &[&str]) -> Self {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        Self::custom(move |m| names.iter().any(|n| n == m.name()))
    }

    /// Spans whose name starts with `prefix`.
    pub fn name_prefix(prefix: &str) -> Self {
        let prefix = prefix.to_string();
        Self::custom(move |m| m.name().starts_with(&prefix))
    }

    /// Spans whose target (by default the module path) is `prefix` or
    /// starts with `prefix::`.
    pub fn target_prefix(prefix: &str) -> Self {
        let prefix = prefix.to_string();
        Self::custom(move |m| {
            let t = m.target();
            t == prefix || (t.starts_with(&prefix) && t[prefix.len()..].starts_with("::"))
        })
    }

    /// Every span.
    pub fn any() -> Self {
        Self::custom(|_| true)
    }

    /// Also requires the span to declare one of `fields` (names separated
    /// by `|`), with or without a value.
    pub fn and_field(self, fields: &str) -> Self {
        let fields: Vec<String> = split_names(fields);
        let test = self.test;
        Self::custom(move |m| {
            test(m)
                && fields
                    .iter()
                    .any(|f| m.fields().field(f.as_str()).is_some())
        })
    }

    /// Also requires the span's target to start with `prefix` (see
    /// [`SpanMatch::target_prefix`]).
    pub fn and_target_prefix(self, prefix: &str) -> Self {
        let other = Self::target_prefix(prefix).test;
        let test = self.test;
        Self::custom(move |m| test(m) && other(m))
    }

    /// Whether `meta` matches.
    pub fn matches(&self, meta: &Metadata<'_>) -> bool {
        (self.test)(meta)
    }
}

fn split_names(fields: &str) -> Vec<String> {
    fields
        .split('|')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// What a field contributes to a statement's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Figure {
    /// The response status: completes the statement; an error at or
    /// above the rule's threshold.
    Status,
    /// A failure report (any value): completes the statement; an error.
    Failure,
    /// `ERRORS`: adds the value (a number, or 1 for `true`).
    Errors,
    /// `WARNINGS`: adds the value.
    Warnings,
    /// `ROWS_SENT` (last value wins).
    RowsSent,
    /// `ROWS_AFFECTED`.
    RowsAffected,
    /// `ROWS_EXAMINED`.
    RowsExamined,
    /// The response was cut short (`true`): cancelled, whatever its
    /// status.
    Cut,
}

/// The most fields one statement rule's templates may refer to.
pub(crate) const MAX_VALUE_FIELDS: usize = 8;

/// The default status at or above which a response is an error (5xx).
pub const DEFAULT_ERROR_STATUS: i64 = 500;

/// How one kind of span becomes a statement: its class name
/// (`statement/<area>/<name>`), its `SQL_TEXT` and `DIGEST` text, and the
/// fields that carry its figures.
///
/// Class names, texts and digests are *templates*: literal text with
/// `{field}` placeholders; `{a|b}` takes the first of `a`, `b` that the
/// span has a value for; `{{` and `}}` are literal braces. Values come from
/// the span's own fields (given when it is created or recorded later with
/// `Span::record`); figures also come from events inside the statement
/// (see [`crate`] docs, *Fields and events*).
///
/// ```
/// use pfs_tracing::{SpanMatch, StatementRule};
///
/// // `info_span!("job", kind = "resize", id = 7, rows = tracing::field::Empty)`
/// // becomes a statement/jobs/resize with SQL_TEXT "resize 7".
/// let jobs = StatementRule::new(SpanMatch::name("job"), "jobs")
///     .class("{kind}")
///     .text("{kind} {id}")
///     .digest("{kind}")
///     .rows_affected("rows")
///     .errors("errors");
/// # let _ = jobs;
/// ```
#[derive(Clone, Debug)]
pub struct StatementRule {
    pub(crate) matcher: SpanMatch,
    /// `statement/<area>/`, or empty when the span name is the class name.
    pub(crate) prefix: String,
    /// The class name after the prefix; `None`: the span's name.
    pub(crate) class: Option<Template>,
    /// The class name (after the prefix) when a class placeholder has no value.
    pub(crate) unknown: String,
    pub(crate) text: Option<Template>,
    pub(crate) digest: Option<Template>,
    /// The fields the templates refer to (value slots).
    pub(crate) names: Vec<String>,
    /// Figure fields.
    pub(crate) figures: Vec<(String, Figure)>,
    /// Status at or above which a response is an error.
    pub(crate) error_status: i64,
}

/// The name of the class statements fold into when the layer's bound on
/// classes is reached: `statement/<area>/other`.
pub const OTHER_CLASS: &str = "other";

/// The default name (after `statement/<area>/`) of statements whose class
/// template lacks a value: `statement/<area>/unknown`.
pub const UNKNOWN_CLASS: &str = "unknown";

impl StatementRule {
    /// Spans matching `matcher` become statements of class
    /// `statement/<area>/<span name>` (change the name with
    /// [`StatementRule::class`]).
    ///
    /// # Panics
    ///
    /// If `area` is empty or contains `/`.
    pub fn new(matcher: SpanMatch, area: &str) -> Self {
        assert!(
            !area.is_empty() && !area.contains('/'),
            "a statement area is one non-empty path segment, not {area:?}"
        );
        Self::with_prefix(matcher, format!("statement/{area}/"))
    }

    /// Spans matching `matcher` whose *name* is a full statement class name
    /// (`statement/<area>/<name>`), as in
    /// `info_span!("statement/jobs/resize")`. Spans whose name does not
    /// start with `statement/` are left out whatever `matcher` says.
    pub fn span_named(matcher: SpanMatch) -> Self {
        let test = matcher.test;
        let matcher = SpanMatch::custom(move |m| {
            ClassKind::from_name(m.name()) == Some(ClassKind::Statement) && test(m)
        });
        Self::with_prefix(matcher, String::new())
    }

    fn with_prefix(matcher: SpanMatch, prefix: String) -> Self {
        Self {
            matcher,
            prefix,
            class: None,
            unknown: UNKNOWN_CLASS.to_string(),
            text: None,
            digest: None,
            names: Vec::new(),
            figures: Vec::new(),
            error_status: DEFAULT_ERROR_STATUS,
        }
    }

    /// The class name after `statement/<area>/`, as a template, e.g.
    /// `"{method} {route}"`. It is rendered when the statement starts (the
    /// span's first enter) from the values known then; if a placeholder
    /// has no value the class is `statement/<area>/unknown` (see
    /// [`StatementRule::unknown_class`]). Ignored for
    /// [`StatementRule::span_named`] rules.
    ///
    /// # Panics
    ///
    /// If the template is malformed (an unclosed `{`, an empty field
    /// name), or the rule's templates together refer to more than 8
    /// fields: rules are set up once at start, from code, like a format
    /// string.
    pub fn class(mut self, template: &str) -> Self {
        if !self.prefix.is_empty() {
            self.class = Some(self.parse(template));
        }
        self
    }

    /// The class name (after `statement/<area>/`) used when the class
    /// template lacks a value; default [`UNKNOWN_CLASS`].
    pub fn unknown_class(mut self, name: &str) -> Self {
        self.unknown = name.to_string();
        self
    }

    /// `SQL_TEXT`, as a template rendered when the statement starts, so
    /// that `events_statements_current` shows it while it runs, and again
    /// when it ends if a value was recorded since (a placeholder without a
    /// value renders as `?`).
    ///
    /// # Panics
    ///
    /// If the template is malformed (an unclosed `{`, an empty field
    /// name), or the rule's templates together refer to more than 8
    /// fields: rules are set up once at start, from code, like a format
    /// string.
    pub fn text(mut self, template: &str) -> Self {
        self.text = Some(self.parse(template));
        self
    }

    /// The `DIGEST` text (hashed into `DIGEST`), as a template rendered
    /// when the statement ends; normally the class name's shape.
    ///
    /// # Panics
    ///
    /// If the template is malformed (an unclosed `{`, an empty field
    /// name), or the rule's templates together refer to more than 8
    /// fields: rules are set up once at start, from code, like a format
    /// string.
    pub fn digest(mut self, template: &str) -> Self {
        self.digest = Some(self.parse(template));
        self
    }

    /// The fields (names separated by `|`) carrying `ROWS_SENT`: a number,
    /// last value wins.
    pub fn rows_sent(self, fields: &str) -> Self {
        self.figure(fields, Figure::RowsSent)
    }

    /// The fields carrying `ROWS_AFFECTED`.
    pub fn rows_affected(self, fields: &str) -> Self {
        self.figure(fields, Figure::RowsAffected)
    }

    /// The fields carrying `ROWS_EXAMINED`.
    pub fn rows_examined(self, fields: &str) -> Self {
        self.figure(fields, Figure::RowsExamined)
    }

    /// The fields counted into `ERRORS`: each value recorded adds itself
    /// (an integer, or a string of digits: `errors = 3`, `errors = "3"`),
    /// or 1 (`true`, a non-numeric string, or any value recorded with `%`
    /// or `?`: `#[instrument(err)]`'s `error = %e` is one error, even when
    /// the error displays as a number such as `404`).
    pub fn errors(self, fields: &str) -> Self {
        self.figure(fields, Figure::Errors)
    }

    /// The fields counted into `WARNINGS`, like [`StatementRule::errors`].
    pub fn warnings(self, fields: &str) -> Self {
        self.figure(fields, Figure::Warnings)
    }

    /// The fields carrying the response status (a number). A statement
    /// whose rule has status or failure fields *completes* when one is
    /// recorded; one that ends without having completed is recorded as
    /// cancelled. A final status at or above
    /// [`StatementRule::error_status`] (default 500) counts one error.
    ///
    /// With or without status fields, a statement span that closes while
    /// its thread panics counts one error, and one that closes while a
    /// `pfs_client::task::Task` or `Cancellable` future is dropped before
    /// it completed (a task cancelled, the losing branch of a `select!`
    /// wrapped with `pfs_cancellable()`) is cancelled unless it completed.
    pub fn status(self, fields: &str) -> Self {
        self.figure(fields, Figure::Status)
    }

    /// The status at or above which a response is an error (default 500).
    pub fn error_status(mut self, min: i64) -> Self {
        self.error_status = min;
        self
    }

    /// The fields whose presence, with any value, reports a failure (as
    /// tower-http's `classification`): completes the statement and counts
    /// one error. A failure and an error status together count one error.
    pub fn failure(self, fields: &str) -> Self {
        self.figure(fields, Figure::Failure)
    }

    /// The fields whose value `true` says the response was cut short: its
    /// body began to be sent and was dropped before its end (the client
    /// hung up mid-download). The statement is then cancelled, whatever
    /// its status. [`crate::CutBodyLayer`] records `body_cut`, which the
    /// HTTP defaults read (a gRPC call needs none: it completes with the
    /// `grpc-status` of its stream's trailers).
    pub fn cut(self, fields: &str) -> Self {
        self.figure(fields, Figure::Cut)
    }

    fn figure(mut self, fields: &str, kind: Figure) -> Self {
        for f in split_names(fields) {
            self.figures.retain(|(n, _)| *n != f);
            self.figures.push((f, kind));
        }
        self
    }

    fn parse(&mut self, template: &str) -> Template {
        let t = Template::parse(template, &mut self.names).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            self.names.len() <= MAX_VALUE_FIELDS,
            "a statement rule's templates refer to at most {MAX_VALUE_FIELDS} fields"
        );
        t
    }

    /// The value slot of field `name`, if a template refers to it.
    pub(crate) fn value_slot(&self, name: &str) -> Option<u8> {
        self.names.iter().position(|n| n == name).map(|i| i as u8)
    }

    /// What field `name` contributes to the figures, if anything.
    pub(crate) fn figure_of(&self, name: &str) -> Option<Figure> {
        self.figures
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, k)| *k)
    }

    /// Whether statements of this rule complete (see [`StatementRule::status`]).
    pub(crate) fn completes(&self) -> bool {
        self.figures
            .iter()
            .any(|(_, k)| matches!(k, Figure::Status | Figure::Failure))
    }

    /// The class name when it does not depend on field values: the
    /// template's only text, or the span's name.
    pub(crate) fn static_class(&self, span_name: &str) -> Option<String> {
        match &self.class {
            None => Some(format!("{}{span_name}", self.prefix)),
            Some(t) if t.is_static() => {
                let mut s = self.prefix.clone();
                t.render(|_| None, None, &mut s);
                Some(s)
            }
            Some(_) => None,
        }
    }

    /// The default rule for HTTP servers: tower-http `TraceLayer` request
    /// spans (tower-http's own `DefaultMakeSpan`, `pfs_tracing::http`'s
    /// `make_span`, or axum's example `http_request` span) become
    /// `statement/http/<METHOD> <route>`:
    ///
    /// | what | from |
    /// | --- | --- |
    /// | spans | named `request` or `http_request`, with a `method` or `http.request.method` field |
    /// | class | `{method\|http.request.method} {route\|matched_path\|http.route}`, else `statement/http/unknown` |
    /// | `SQL_TEXT` | `{method\|http.request.method} {uri\|url.path}` |
    /// | `DIGEST` text | the class name after `statement/http/` |
    /// | status | `status`, `http.response.status_code`; 5xx is an error; none: cancelled |
    /// | failure | `classification` (tower-http's `DefaultOnFailure`) |
    pub fn http() -> Self {
        Self::new(
            SpanMatch::names(&["request", "http_request"]).and_field("method|http.request.method"),
            "http",
        )
        .class("{method|http.request.method} {route|matched_path|http.route}")
        .text("{method|http.request.method} {uri|url.path}")
        .digest("{method|http.request.method} {route|matched_path|http.route}")
        .status("status|http.response.status_code")
        .failure("classification")
        .cut("body_cut")
    }

    /// The default rule for gRPC servers: `grpc_request` spans of
    /// `pfs_tracing::grpc`'s `make_span` (behind tower-http's
    /// `TraceLayer::new_for_grpc()`) become `statement/grpc/<rpc>`:
    ///
    /// | what | from |
    /// | --- | --- |
    /// | spans | named `grpc_request`, with an `rpc` field |
    /// | class | `{rpc}` (`package.Service/Method`), else `statement/grpc/unknown` |
    /// | `SQL_TEXT` | `{rpc\|uri}` (the request URI for a path that names no method) |
    /// | `DIGEST` text | `{rpc}` |
    /// | errors | a non-OK `grpc-status` (tower-http's gRPC classifier reports it as a failure, `classification`); the HTTP `status` is 200 |
    /// | cancelled | a call that ended without a `grpc-status` (in the headers or the stream's trailers): its future dropped (a client's deadline), or its response stream dropped before the trailers |
    pub fn grpc() -> Self {
        Self::new(SpanMatch::name("grpc_request").and_field("rpc"), "grpc")
            .class("{rpc}")
            .text("{rpc|uri}")
            .digest("{rpc}")
            .status("status")
            .failure("classification")
    }
}

/// How one kind of span becomes a stage (a phase of the statement it runs
/// in): class `stage/<area>/<span name>`, or the span's own name.
///
/// ```
/// use pfs_tracing::{SpanMatch, StageRule};
///
/// // Every span of my_app::db inside a statement: stage/db/<span name>.
/// let db = StageRule::new(SpanMatch::target_prefix("my_app::db"), "db");
/// # let _ = db;
/// ```
#[derive(Clone, Debug)]
pub struct StageRule {
    pub(crate) matcher: SpanMatch,
    /// `stage/<area>/`, or empty when the span name is the class name.
    pub(crate) prefix: String,
}

impl StageRule {
    /// Spans matching `matcher` become stages of class
    /// `stage/<area>/<span name>`.
    ///
    /// # Panics
    ///
    /// If `area` is empty or contains `/`.
    pub fn new(matcher: SpanMatch, area: &str) -> Self {
        assert!(
            !area.is_empty() && !area.contains('/'),
            "a stage area is one non-empty path segment, not {area:?}"
        );
        Self {
            matcher,
            prefix: format!("stage/{area}/"),
        }
    }

    /// Spans matching `matcher` whose name is a full stage class name
    /// (`stage/<area>/<name>`), as in `info_span!("stage/db/lookup")`.
    pub fn span_named(matcher: SpanMatch) -> Self {
        let test = matcher.test;
        Self {
            matcher: SpanMatch::custom(move |m| {
                ClassKind::from_name(m.name()) == Some(ClassKind::Stage) && test(m)
            }),
            prefix: String::new(),
        }
    }

    /// The class name of a span named `span_name`.
    pub(crate) fn class_name(&self, span_name: &str) -> String {
        format!("{}{span_name}", self.prefix)
    }
}

/// All the rules of one layer, in order: the first matching statement
/// rule wins, then the first matching stage rule.
#[derive(Clone, Debug, Default)]
pub(crate) struct Rules {
    pub(crate) statements: Vec<StatementRule>,
    pub(crate) stages: Vec<StageRule>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_fields_split_and_override() {
        let r = StatementRule::new(SpanMatch::any(), "t")
            .errors("e | err")
            .warnings("err");
        assert_eq!(r.figure_of("e"), Some(Figure::Errors));
        assert_eq!(r.figure_of("err"), Some(Figure::Warnings));
        assert!(!r.completes());
        assert!(StatementRule::http().completes());
    }

    #[test]
    fn static_class_names() {
        let r = StatementRule::new(SpanMatch::any(), "jobs");
        assert_eq!(
            r.static_class("resize").as_deref(),
            Some("statement/jobs/resize")
        );
        let r = r.class("all");
        assert_eq!(
            r.static_class("resize").as_deref(),
            Some("statement/jobs/all")
        );
        let r = r.class("{kind}");
        assert_eq!(r.static_class("resize"), None);
        let named = StatementRule::span_named(SpanMatch::any()).class("{x}");
        assert_eq!(
            named.static_class("statement/a/b").as_deref(),
            Some("statement/a/b")
        );
    }

    #[test]
    #[should_panic(expected = "one non-empty path segment")]
    fn area_is_one_segment() {
        let _ = StatementRule::new(SpanMatch::any(), "a/b");
    }
}
