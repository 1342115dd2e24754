//! # pfs-tracing: `tracing` spans as pfs-exporter statements and stages
//!
//! [`PfsLayer`] is a [`tracing_subscriber::Layer`] that records the spans
//! an application already has as Performance-Schema statements and
//! stages, written by `pfs-client` into the process's shared-memory
//! segment (call `pfs_client::init` first) and exported by `pfs-agent`.
//! Rules say which spans are statements and which are stages, how their
//! classes are named and which fields carry `SQL_TEXT`, `DIGEST`, rows
//! and errors. The defaults ([`PfsLayer::http`]) turn tower-http
//! `TraceLayer` request spans into `statement/http/<METHOD> <route>`.
//!
//! ```
//! use tracing_subscriber::prelude::*;
//!
//! // if let Err(e) = pfs_client::init() { eprintln!("pfs: {e}") }
//! tracing_subscriber::registry()
//!     .with(pfs_tracing::PfsLayer::http())
//!     .with(tracing_subscriber::fmt::layer().with_filter(tracing_subscriber::filter::LevelFilter::INFO))
//!     .init();
//!
//! let span = tracing::info_span!("statement/jobs/nightly"); // a statement, by its name
//! span.in_scope(|| {
//!     let _stage = tracing::info_span!("stage/jobs/load").entered(); // a stage in it
//!     // ... work ...
//! });
//! drop(span); // the statement ends when the span closes
//! ```
//!
//! # The model
//!
//! **A statement span is a logical thread.** Each span a statement rule
//! matches owns a [`pfs_client::task::TaskContext`] (its own `THREAD_ID`
//! and `EVENT_ID` sequence, see `docs/ASYNC.md`), kept in the span's
//! extensions with its statement, field values and figures:
//!
//! | span hook | what the layer does |
//! | --- | --- |
//! | new | reads the rule's fields; nothing is recorded yet |
//! | enter | swaps the span's context in on this thread; on the first enter, starts the statement in it (its class is chosen now) |
//! | exit | swaps the context out |
//! | record, events inside | updates the values and figures |
//! | close | swaps the context in, ends the statement with its text, digest and figures, swaps out |
//!
//! So a span instrumenting a future (`.instrument(span)`, or tower-http's
//! `TraceLayer`, which enters its span on every poll) becomes a task
//! statement: `TIMER_WAIT` is wall time from the first enter to the
//! close, `CPU_TIME` the time the span was entered meanwhile (its *busy*
//! time: the future being polled). `CPU_TIME ≤ TIMER_WAIT` always. The
//! statement is its context's first event (`EVENT_ID` 1, under a
//! `THREAD_ID` of its own); every event recorded while the span is
//! entered (its stages, waits of `pfs_client` instruments) nests in it
//! under the same `THREAD_ID`, whichever worker thread it ran on.
//!
//! Statement spans do **not nest** in statement spans: a statement span
//! inside another is a logical thread of its own, its statement has no
//! parent (`NESTING_EVENT_ID` NULL), and while it is entered the outer
//! one's stages and waits are not current. A span never entered records
//! nothing. Entered on two threads at once (a span shared by concurrent
//! tasks), the context is current only on the thread that entered it
//! first; the other thread records into its own state meanwhile. From a
//! blocking thread (`spawn_blocking`), enter the request's span with
//! [`enter_blocking`]: it waits briefly for the worker that spawned the
//! closure to leave the span, which a plain `enter` races with.
//!
//! **Stages.** A span a stage rule matches, inside a statement span (the
//! closest statement span above it), enters its stage class on its first
//! enter. Entered where its statement span is not the current one (work
//! spawned from inside the stage carries the stage span), it takes its
//! statement's context there, as the statement span's enter would, so
//! what is recorded nests in the statement (and in this stage while it
//! is the statement's open stage); if another thread has that context
//! entered, nothing is recorded in it meanwhile. As in PFS, stages do not nest: entering a stage ends the
//! statement's open stage. A stage ends when its span closes if it is
//! still the statement's open stage, else at the next stage or with the
//! statement. Stage spans outside any statement span are not recorded.
//! (A stage entered directly with `pfs_client` inside a stage span is
//! ended when that span closes.)
//!
//! **`SOURCE`** of a statement or stage is its span's callsite, the
//! `span!` (or `#[instrument]`) `file:line` from the span's metadata (for
//! request spans made by tower-http or `pfs_tracing::http::make_span` (feature `http`), the line there
//! that makes them: the class tells the routes apart).
//!
//! **Cancellation.** A statement whose rule has *status* or *failure*
//! fields ([`StatementRule::status`], [`StatementRule::failure`])
//! completes when one is recorded on the span or in an event inside it.
//! A statement span closed without having completed is recorded as
//! cancelled (`CANCELLED` flag, `COUNT_CANCELLED`, not an error): with
//! hyper, a client that hangs up drops the response future, which closes
//! tower-http's span without its response event. Under any rule, a span
//! that closes while a future is dropped before it completed, inside a
//! `pfs_client::task::Task` being dropped or a `Cancellable` future
//! (`pfs_cancellable()`: a `select!` branch, a `timeout`), is cancelled
//! unless it completed; so are the statement spans entered in that drop
//! (a handler's span inside another's). If the span closes while its
//! thread panics, it counts one error instead (unless errors were
//! counted on it).
//!
//! # Rules and defaults
//!
//! A [`PfsLayerBuilder`] takes [`StatementRule`]s and [`StageRule`]s,
//! tried in order (statement rules first); a rule applies to the spans of
//! the callsites its [`SpanMatch`] accepts. Rules are applied once per
//! callsite (`register_callsite`, or the first span of a callsite) and the
//! decision is cached in a lock-free table, so a span no rule matches
//! costs a table lookup when created, a span lookup and a table lookup
//! when entered and when closed, and a scan of this thread's (short)
//! stack of entered statement spans when exited.
//!
//! [`PfsLayer::http`] (= `builder().http_defaults()`) has:
//!
//! * [`StatementRule::http`]: spans named `request` or `http_request`
//!   with a `method` field (tower-http's `DefaultMakeSpan`, this crate's
//!   `http::make_span`, axum's tracing example) become
//!   `statement/http/{method} {route|matched_path|http.route}`, e.g.
//!   `statement/http/GET /users/{id}`; a span without a route (tower-http's
//!   default span, or a request no axum route matched) is
//!   `statement/http/unknown`. `SQL_TEXT` is `{method} {uri}` (with the
//!   query string: if it carries secrets, give the rule a text template
//!   of your own), the `DIGEST` text the class name's `<METHOD> <route>`.
//!   The `status` field
//!   of tower-http's response event (`DefaultOnResponse`) completes the
//!   statement, and a status ≥ 500 counts one error; the
//!   `classification` field of its failure event (`DefaultOnFailure`) also
//!   completes it and counts one error (one in all for a 5xx response).
//! * [`PfsLayerBuilder::named_spans`]: a span named like a PFS instrument
//!   is one: `info_span!("statement/jobs/nightly")`,
//!   `info_span!("stage/jobs/load")`.
//!
//! # Fields and events
//!
//! Templates ([`StatementRule::class`], [`StatementRule::text`],
//! [`StatementRule::digest`]) read the span's own fields, given when it is
//! created or recorded later with `Span::record`, in their `Display`
//! form (`Debug` for `?` fields). **Order matters**: the class is chosen
//! when the statement starts, at the span's first enter, from the values
//! known then; `SQL_TEXT` is rendered then too, so that the running
//! statement shows it (`?` for a value not known yet); a value recorded
//! later still shows in `SQL_TEXT` and `DIGEST` (rendered again when the
//! span closes) but does not rename the class.
//! Figure fields (rows, errors, warnings, status, failure) are read from
//! the span's fields and from every event whose closest statement span
//! (through stage and other spans) is this one.
//!
//! # Bounded classes
//!
//! Class names built from field values are bounded: a layer creates at
//! most [`PfsLayerBuilder::max_classes`] (default
//! [`DEFAULT_MAX_CLASSES`]) of them. Past the bound, a statement whose
//! name is new is recorded under its rule's `statement/<area>/other`
//! class, and `pfs_lost_total{kind="instrument_classes"}` counts one lost class per
//! distinct name folded (the first 4096 folded names are remembered;
//! beyond, every statement folded counts one). The `unknown` and `other`
//! classes of each rule are outside the bound, as are static names (a
//! span's own name, a template without placeholders), which are as
//! bounded as the program's callsites. A statement's class is resolved
//! once per statement, never per poll: from a per-thread cache of recent
//! classes by rule (the statement's values compared with their names, no
//! name rendered), else from a per-thread cache of recent names, else
//! under a read lock.
//!
//! # Filters and other layers
//!
//! The layer composes with any other on one `Registry`:
//! `registry().with(PfsLayer::http()).with(fmt::layer()).with(tracing_opentelemetry::layer())`.
//! It never filters (it answers `Interest::always()`), and it only sees
//! what the subscriber creates: a *global* filter (a filter layer, or
//! `EnvFilter` added with `.with(filter)`) that disables DEBUG also
//! disables tower-http's default request span and its response event,
//! both DEBUG. Either filter the other layers only (`fmt::layer().with_filter(...)`:
//! per-layer filters leave this layer's view whole), or make both INFO:
//! `make_span_with(pfs_tracing::http::make_span)` (INFO) and
//! `on_response(DefaultOnResponse::new().level(Level::INFO))`. Without a
//! response event no request can be told to have completed: while the
//! subscriber disables DEBUG for everyone and no statement of a rule with
//! status fields has completed with a status, its statements that close
//! without one are not counted as cancelled (a client's hang-up is then
//! missed), and the first says so in the log, once.
//! Only one `PfsLayer` per subscriber records a given span (the first
//! one to see it).
//!
//! # Cost
//!
//! Medians of `benches/layer.rs` on the project's 2-vCPU machine (one
//! span's new, enter, exit and close; see the bench for the cases):
//!
//! | case | ns |
//! | --- | ---: |
//! | bare `Registry` | 137 |
//! | a span no rule matches, with the layer | 100 |
//! | a span that is a statement (`statement/http/GET /x`) | 423 |
//! | of which the `pfs-client` calls alone (context, statement, text, task slot) | 139 |
//!
//! A statement span pays the client's statement (six timer reads with
//! `CPU_TIME`, `SQL_TEXT` copied into the current row) and the layer's
//! bookkeeping (an extension holding a box reused from a per-thread pool,
//! four span lookups, the class from the thread's own copy of the names
//! it has seen, the text rendered, and the digest unless it is the class
//! name): once per request, not per poll. A statement or stage span
//! allocates one small block, its extension entry (tracing-subscriber
//! boxes every extension value; with `PfsAllocator` it is counted as the
//! application's memory, like the registry's own); a span no rule matches
//! allocates nothing (`tests/allocations.rs`). Each later
//! enter and exit of the span is a context swap; the first exit with the
//! statement open also takes a task slot, where the request stays in
//! `events_statements_current` while it awaits (written again only when
//! its text or stage changed; `PFS_TASK_SLOTS=0` turns slots off).
//!
//! # A complete server
//!
//! axum with tower-http's `TraceLayer` (features `axum` of this crate,
//! `trace` of tower-http):
//!
//! ```no_run
//! # #[cfg(feature = "axum")]
//! # mod server {
//! use axum::{Router, routing::get};
//! use tower_http::trace::{DefaultOnResponse, TraceLayer};
//! use tracing::Level;
//! use tracing_subscriber::{filter::LevelFilter, prelude::*};
//!
//! async fn get_user() -> &'static str {
//!     let _load = tracing::info_span!("stage/app/load_user").entered();
//!     "alice"
//! }
//!
//! pub async fn main() {
//!     if let Err(e) = pfs_client::init() {
//!         eprintln!("instrumentation disabled: {e}");
//!     }
//!     tracing_subscriber::registry()
//!         .with(pfs_tracing::PfsLayer::http())
//!         .with(tracing_subscriber::fmt::layer().with_filter(LevelFilter::INFO))
//!         .init();
//!     let app = Router::new()
//!         .route("/users/{id}", get(get_user))
//!         // Inside the TraceLayer: a response body cut short is cancelled.
//!         .layer(pfs_tracing::CutBodyLayer)
//!         .layer(
//!             TraceLayer::new_for_http()
//!                 .make_span_with(pfs_tracing::http::make_span)
//!                 .on_response(DefaultOnResponse::new().level(Level::INFO)),
//!         );
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.unwrap();
//!     // GET /users/7 is a statement/http/GET /users/{id}, SQL_TEXT
//!     // "GET /users/7", with a stage/app/load_user in it.
//!     axum::serve(listener, app).await.unwrap();
//! }
//! # }
//! ```
//!
//! # Modules, in layers
//!
//! Each module uses only modules of lower layers.
//!
//! | layer | module | job |
//! | --- | --- | --- |
//! | 0 | `template` | the template language of class names, texts and digests |
//! | 0 | `stack` | the thread-local stack of statement spans entered on this thread |
//! | 0 | `blocking` | [`enter_blocking`]: a blocking thread's enter, which may wait for the span to be free |
//! | 0 | `classes` | the bounded set of statement classes named from field values |
//! | 0 | `http` | `make_span`, a request span naming axum's route (feature `http`) |
//! | 0 | `grpc` | `make_span`, a gRPC request span naming the RPC (feature `http`) |
//! | 0 | `body` | [`CutBodyLayer`]: a response body cut short marks its request span (feature `http`) |
//! | 1 | `rules` | [`SpanMatch`], [`StatementRule`], [`StageRule`] and the HTTP defaults |
//! | 2 | `callsite` | per-callsite decisions, in a lock-free table |
//! | 3 | `span` | the per-span state in extensions, and the field visitors |
//! | 4 | `layer` | [`PfsLayer`], its builder and its `Layer` hooks |

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod blocking;
#[cfg(feature = "http")]
pub mod body;
mod callsite;
mod classes;
#[cfg(feature = "http")]
pub mod grpc;
#[cfg(feature = "http")]
pub mod http;
mod layer;
mod rules;
mod span;
mod stack;
mod template;

pub use blocking::{ENTER_WAIT, enter_blocking};
#[cfg(feature = "http")]
pub use body::CutBodyLayer;
pub use layer::{DEFAULT_MAX_CLASSES, PfsLayer, PfsLayerBuilder};
pub use rules::{
    DEFAULT_ERROR_STATUS, OTHER_CLASS, SpanMatch, StageRule, StatementRule, UNKNOWN_CLASS,
};
