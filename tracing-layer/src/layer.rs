//! Layer 4. [`PfsLayer`], the `tracing_subscriber::Layer`, and its
//! builder: span hooks turned into context swaps, statements and stages.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use pfs_client::StatementClass;
use tracing_core::span::{Attributes, Id, Record};
use tracing_core::{Event, Interest, LevelFilter, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::{Extensions, ExtensionsMut, LookupSpan, SpanRef};

use crate::blocking;
use crate::callsite::{Found, Role, Sites, StatementSite};
use crate::classes::Classes;
use crate::rules::{OTHER_CLASS, Rules, SpanMatch, StageRule, StatementRule};
use crate::span::{Closing, EventVisitor, Figures, PfsSpan, SpanVisitor, StageSpan, StatementSpan};
use crate::stack::{self, Exit};

/// The default bound on statement classes a layer names from field
/// values ([`PfsLayerBuilder::max_classes`]).
pub const DEFAULT_MAX_CLASSES: usize = 128;

static NEXT_LAYER: AtomicU64 = AtomicU64::new(1);

/// A `tracing_subscriber::Layer` that records spans as pfs-exporter
/// statements and stages, by rules: see the [crate] documentation.
///
/// ```
/// use tracing_subscriber::prelude::*;
///
/// let subscriber = tracing_subscriber::registry().with(pfs_tracing::PfsLayer::http());
/// # let _ = subscriber;
/// ```
#[derive(Debug)]
pub struct PfsLayer {
    /// Tells this layer's spans from another's (thread stack, extensions).
    id: u64,
    rules: Rules,
    sites: Sites,
    classes: Classes,
    /// By statement rule: its `other` and `unknown` classes.
    fallback: Box<[Fallback]>,
    /// By statement rule: whether its completions can be seen.
    completion: Box<[Completion]>,
}

/// What a statement rule with status fields has seen of completions: a
/// span that closes without one is cancelled only if one could have come
/// ([`PfsLayer::completion_unseen`]).
#[derive(Debug, Default)]
struct Completion {
    /// A statement of the rule completed with a status.
    seen: AtomicBool,
    /// The warning that none can be seen was given.
    warned: AtomicBool,
}

#[derive(Debug, Default)]
struct Fallback {
    other: OnceLock<StatementClass>,
    unknown: OnceLock<StatementClass>,
    /// The rule's digest template is its class template (as the HTTP
    /// rule's): a class name rendered is the digest text too.
    digest_is_class: bool,
}

/// Builds a [`PfsLayer`] from rules.
///
/// ```
/// use pfs_tracing::{PfsLayer, SpanMatch, StageRule, StatementRule};
///
/// let layer = PfsLayer::builder()
///     .http_defaults()
///     .statement(StatementRule::new(SpanMatch::name("job"), "jobs").class("{kind}"))
///     .stage(StageRule::new(SpanMatch::target_prefix("my_app::db"), "db"))
///     .max_classes(64)
///     .build();
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct PfsLayerBuilder {
    rules: Rules,
    max_classes: usize,
}

impl PfsLayer {
    /// The defaults: [`PfsLayerBuilder::http_defaults`].
    pub fn http() -> Self {
        Self::builder().http_defaults().build()
    }

    /// A builder with no rule yet.
    pub fn builder() -> PfsLayerBuilder {
        PfsLayerBuilder {
            rules: Rules::default(),
            max_classes: DEFAULT_MAX_CLASSES,
        }
    }
}

impl PfsLayerBuilder {
    /// Adds a statement rule, after those already added (the first
    /// matching statement rule wins; statement rules come before stage
    /// rules).
    pub fn statement(mut self, rule: StatementRule) -> Self {
        self.rules.statements.push(rule);
        self
    }

    /// Adds a stage rule, after those already added.
    pub fn stage(mut self, rule: StageRule) -> Self {
        self.rules.stages.push(rule);
        self
    }

    /// Adds the HTTP rule ([`StatementRule::http`]), the gRPC rule
    /// ([`StatementRule::grpc`]) and [`PfsLayerBuilder::named_spans`].
    pub fn http_defaults(self) -> Self {
        self.statement(StatementRule::http())
            .statement(StatementRule::grpc())
            .named_spans()
    }

    /// Spans named like PFS instruments become them:
    /// `info_span!("statement/jobs/resize")` a statement of that class,
    /// `info_span!("stage/db/lookup")` a stage of that class.
    pub fn named_spans(self) -> Self {
        self.statement(StatementRule::span_named(SpanMatch::any()))
            .stage(StageRule::span_named(SpanMatch::any()))
    }

    /// The most statement classes the layer names from field values
    /// (default [`DEFAULT_MAX_CLASSES`]); see the [crate] docs, *Bounded
    /// classes*. They count against the segment's own capacity
    /// (`pfs_client::Config::max_classes`, 256 by default).
    pub fn max_classes(mut self, n: usize) -> Self {
        self.max_classes = n;
        self
    }

    /// The layer.
    pub fn build(self) -> PfsLayer {
        let fallback = self
            .rules
            .statements
            .iter()
            .map(|r| Fallback {
                digest_is_class: r.digest.is_some() && r.digest == r.class,
                ..Fallback::default()
            })
            .collect();
        let completion = self
            .rules
            .statements
            .iter()
            .map(|_| Completion::default())
            .collect();
        PfsLayer {
            id: NEXT_LAYER.fetch_add(1, Relaxed),
            rules: self.rules,
            sites: Sites::new(),
            classes: Classes::new(self.max_classes),
            fallback,
            completion,
        }
    }
}

/// The layer's data in a span's extensions, with the layer it belongs to
/// (a second `PfsLayer` on the same subscriber leaves spans of the first
/// alone).
#[derive(Debug)]
struct Tagged {
    layer: u64,
    span: PfsSpan,
}

thread_local! {
    /// Where class names and texts are rendered.
    static BUF: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `f` on an empty scratch string.
fn with_buf<R>(f: impl FnOnce(&mut String) -> R) -> R {
    let mut f = Some(f);
    let r = BUF.try_with(|b| {
        let mut b = b.try_borrow_mut().ok()?;
        b.clear();
        let r = (f.take()?)(&mut b);
        if b.capacity() > 4096 {
            *b = String::new();
        }
        Some(r)
    });
    match (r, f) {
        (Ok(Some(r)), _) => r,
        (_, Some(f)) => f(&mut String::new()),
        (_, None) => unreachable!("f ran but returned nothing"),
    }
}

/// A class this thread found for a name rendered from a rule's class
/// template: the name decides the class for good (a remembered name), so
/// a statement whose values render the same name takes it without
/// rendering it or looking it up.
#[derive(Debug)]
struct RecentClass {
    layer: u64,
    rule: usize,
    /// The name after the rule's prefix.
    name: String,
    class: StatementClass,
}

/// Recent classes per thread.
const RECENT_CLASSES: usize = 8;

thread_local! {
    /// Recent classes, replaced round-robin.
    static RECENT: RefCell<(Vec<RecentClass>, usize)> = const { RefCell::new((Vec::new(), 0)) };
}

/// `f` of the recent class of `layer`'s rule `rule` whose name `renders`
/// (tells whether the statement's values render the name, after the
/// prefix), and of that name.
#[inline]
fn recent_class<R>(
    layer: u64,
    rule: usize,
    renders: impl Fn(&str) -> bool,
    f: impl FnOnce(StatementClass, &str) -> R,
) -> Option<R> {
    RECENT
        .try_with(|r| {
            let r = r.try_borrow().ok()?;
            let c =
                r.0.iter()
                    .find(|c| c.layer == layer && c.rule == rule && renders(&c.name))?;
            Some(f(c.class, &c.name))
        })
        .ok()
        .flatten()
}

/// Remembers `class` for `name` (after the prefix) of `layer`'s rule `rule`.
fn remember_class(layer: u64, rule: usize, name: &str, class: StatementClass) {
    let _ = RECENT.try_with(|r| {
        let Ok(mut r) = r.try_borrow_mut() else {
            return;
        };
        let (recent, next) = &mut *r;
        if recent.len() < RECENT_CLASSES {
            recent.push(RecentClass {
                layer,
                rule,
                name: name.to_string(),
                class,
            });
            return;
        }
        let c = &mut recent[*next];
        *next = (*next + 1) % RECENT_CLASSES;
        (c.layer, c.rule, c.class) = (layer, rule, class);
        c.name.clear();
        c.name.push_str(name);
    });
}

/// Says once per process (once with the client's own warning of the kind)
/// that a statement span came before `pfs_client::init` (or with no init
/// at all): a program that forgot it would otherwise record nothing,
/// silently. (A program that starts its subscriber before `init` sees it
/// once, and records from `init` on.)
#[cold]
fn not_recording_yet(span: &str) {
    // (Inside a subscriber's callback: `warning::warn`, which this calls,
    // emits it where an event cannot break the subscriber's per-layer
    // filters.)
    pfs_client::warning::not_initialised("statement span", span);
}

/// Whether the client records (initialised).
#[inline]
fn recording() -> bool {
    pfs_client::segment_path().is_some()
}

impl PfsLayer {
    #[inline]
    fn site(&self, meta: &'static Metadata<'static>) -> Found<'_> {
        self.sites.get(meta, || Role::decide(meta, &self.rules))
    }

    /// Whether spans of this callsite can be statements or stages: a
    /// lock-free lookup that spares other spans the extensions' lock.
    #[inline]
    fn may_be_tagged(&self, meta: &'static Metadata<'static>) -> bool {
        matches!(&*self.site(meta), Role::Statement(_) | Role::Stage(_))
    }

    /// This layer's statement in a span's extensions.
    fn statement_mut<'a>(&self, ext: &'a mut ExtensionsMut<'_>) -> Option<&'a mut StatementSpan> {
        match ext.get_mut::<Tagged>() {
            Some(Tagged {
                layer,
                span: PfsSpan::Statement(s),
            }) if *layer == self.id => Some(&mut **s),
            _ => None,
        }
    }

    /// The statement span a span with these extensions stands for: itself,
    /// or a stage's statement.
    fn statement_of(&self, ext: &Extensions<'_>, id: u64) -> Option<u64> {
        match ext.get::<Tagged>() {
            Some(t) if t.layer == self.id => Some(match &t.span {
                PfsSpan::Statement(_) => id,
                PfsSpan::Stage(st) => st.statement,
            }),
            _ => None,
        }
    }

    /// The closest statement span at or above `span`.
    fn statement_at_or_above<S>(&self, span: Option<SpanRef<'_, S>>) -> Option<u64>
    where
        S: for<'a> LookupSpan<'a>,
    {
        let mut next = span;
        while let Some(s) = next {
            if let Some(id) = self.statement_of(&s.extensions(), s.id().into_u64()) {
                return Some(id);
            }
            next = s.parent();
        }
        None
    }

    /// Runs `f` on the statement of span `id`, if it is this layer's.
    fn with_statement<S>(&self, ctx: &Context<'_, S>, id: u64, f: impl FnOnce(&mut StatementSpan))
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        if let Some(span) = ctx.span(&Id::from_u64(id)) {
            let mut ext = span.extensions_mut();
            if let Some(s) = self.statement_mut(&mut ext) {
                f(s);
            }
        }
    }

    /// Swaps out the context of `id`, whose enter is below those of the
    /// statement spans `above` on this thread: they are swapped out first
    /// and back in after, so that every swap undoes the latest one.
    fn swap_out_below<S>(&self, ctx: &Context<'_, S>, id: u64, above: &[u64])
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        for &a in above.iter().rev() {
            self.with_statement(ctx, a, |s| {
                s.task.swap_out();
            });
        }
        self.with_statement(ctx, id, |s| {
            s.task.swap_out();
        });
        for &a in above {
            self.with_statement(ctx, a, |s| {
                s.task.swap_in();
            });
        }
    }

    /// Starts the statement of a span, in its class chosen now.
    fn start_statement(&self, site: &StatementSite, s: &mut StatementSpan) {
        let class = self.statement_class(site, s);
        let stmt = s.stmt.insert(class.start_task_at(site.source));
        if s.digest_set {
            stmt.set_digest_text(&s.digest);
        }
        // SQL_TEXT from the values known now (a request's method and
        // path), so that the running statement shows it; rendered again
        // at the close only if a value was recorded since.
        if let Some(t) = &self.rules.statements[s.rule].text {
            let values = &s.values;
            with_buf(|buf| {
                t.render(|i| values.get(i), Some("?"), buf);
                stmt.set_text(buf);
            });
            s.text_set = true;
        }
    }

    /// The class of a statement starting now. If its rule's digest
    /// template is its class template and the name is rendered, the name
    /// (after the prefix) is also the digest text: kept in `s.digest`.
    fn statement_class(&self, site: &StatementSite, s: &mut StatementSpan) -> StatementClass {
        if let Some(name) = &site.static_name {
            return *site.class.get_or_init(|| StatementClass::register(name));
        }
        let rule = &self.rules.statements[site.rule];
        let fallback = &self.fallback[site.rule];
        let Some(template) = &rule.class else {
            unreachable!("a rule without class template has a static name")
        };
        let StatementSpan {
            values,
            digest,
            digest_set,
            ..
        } = s;
        let mut named = |class: StatementClass, name: &str| {
            if fallback.digest_is_class {
                digest.clear();
                digest.push_str(name);
                *digest_set = true;
            }
            class
        };
        let value = |i| values.get(i);
        if let Some(class) = recent_class(
            self.id,
            site.rule,
            |name| template.renders_as(value, name),
            &mut named,
        ) {
            return class;
        }
        with_buf(|buf| {
            buf.push_str(&rule.prefix);
            // A value with a control character (a tab or newline taken
            // from a request) makes no instrument name: the unknown class.
            if template.render(value, None, buf) && !buf.contains(char::is_control) {
                let (class, remembered) = self.classes.get(buf, || {
                    *fallback.other.get_or_init(|| {
                        StatementClass::register(&format!("{}{OTHER_CLASS}", rule.prefix))
                    })
                });
                let name = &buf[rule.prefix.len()..];
                if remembered {
                    remember_class(self.id, site.rule, name, class);
                }
                named(class, name)
            } else {
                *fallback.unknown.get_or_init(|| {
                    StatementClass::register(&format!("{}{}", rule.prefix, rule.unknown))
                })
            }
        })
    }

    /// Enter of a statement span: swap its context in; the first time,
    /// start its statement in it.
    #[inline]
    fn enter_statement(&self, id: u64, site: &Role, s: &mut StatementSpan) {
        // Entered again on this thread: its context is in already.
        let swapped = stack::enter(self.id, id, id, || s.task.swap_in());
        if swapped
            && s.stmt.is_none()
            && let Role::Statement(site) = site
        {
            self.start_statement(site, s);
        }
    }

    /// A span closed while entered on this thread (only the id-based
    /// subscriber API allows it): swap the context it took out first.
    #[cold]
    fn unstack_closed<S>(&self, ctx: &Context<'_, S>, id: u64)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        self.undo(ctx, stack::remove_all(self.id, id));
    }

    /// Swaps out the context an exit found to swap out.
    fn undo<S>(&self, ctx: &Context<'_, S>, exit: Exit)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        match exit {
            Exit::Nothing => {}
            Exit::Innermost(context) => self.with_statement(ctx, context, |s| {
                s.task.swap_out();
            }),
            Exit::Below(context, above) => self.swap_out_below(ctx, context, &above),
        }
    }

    /// Close of a statement span: end its statement inside its context.
    fn close_statement(&self, s: &mut StatementSpan) {
        let Some(stmt) = &mut s.stmt else {
            return; // never entered (or not recording then): nothing to record
        };
        let rule = &self.rules.statements[s.rule];
        let values = &s.values;
        with_buf(|buf| {
            if let Some(t) = &rule.text
                && !s.text_set
            {
                t.render(|i| values.get(i), Some("?"), buf);
                stmt.set_text(buf);
            }
            if let Some(t) = &rule.digest
                && !s.digest_set
            {
                buf.clear();
                t.render(|i| values.get(i), Some("?"), buf);
                stmt.set_digest_text(buf);
            }
        });
        let mut end = Closing::now();
        end.completion_unseen = self.completion_unseen(s.rule, &s.figures, rule, end);
        s.figures.apply(stmt, rule, end);
        // Entered only to end the statement: not the task's poll time.
        s.task.swap_in_unmeasured();
        s.stmt = None; // ends it, in place
        s.task.swap_out();
    }

    /// Whether a statement span of rule `rule_index` (`rule`), with
    /// `figures`, closing as `end` without having completed, may have
    /// completed unseen: its rule has status fields,
    /// no statement of the rule ever completed with a status, and the
    /// subscriber disables DEBUG for everyone (a global filter at INFO),
    /// so that tower-http's response event (DEBUG) never comes. Such a
    /// span is not counted as cancelled, and the first one says so, once.
    /// (A statement that did complete marks the rule's completions seen.)
    fn completion_unseen(
        &self,
        rule_index: usize,
        figures: &Figures,
        rule: &StatementRule,
        end: Closing,
    ) -> bool {
        let c = &self.completion[rule_index];
        if figures.has_status() {
            c.seen.store(true, Relaxed);
            return false;
        }
        let unseen = rule.completes()
            && !figures.completed()
            && !end.cancelling
            && !end.panicking
            && !c.seen.load(Relaxed)
            && LevelFilter::current() < LevelFilter::DEBUG;
        if unseen && !c.warned.swap(true, Relaxed) {
            // (Inside a subscriber's callback: `warning::warn` emits it
            // where an event cannot break the subscriber's filters.)
            pfs_client::warning::warn(
                "pfs-tracing: a request span closed without a response event, and DEBUG events are disabled for the whole subscriber (a global filter at INFO or above, e.g. registry().with(EnvFilter::new(\"info\"))): tower-http's response event is DEBUG, so no request can be told to have completed or been cancelled. Until a status is seen, requests without one are not counted as cancelled (COUNT_CANCELLED misses client hang-ups); 5xx still count as errors. Filter the other layers instead (fmt::layer().with_filter(EnvFilter::new(\"info\"))), or make the response event INFO (TraceLayer::on_response(DefaultOnResponse::new().level(Level::INFO)), which a global INFO fmt layer then also logs, a line per request)",
                |m| tracing::warn!("{m}"),
            );
        }
        unseen
    }

    /// Close of a stage span that was entered: end its stage if it is
    /// still its statement's open stage.
    fn close_stage<S>(&self, ctx: &Context<'_, S>, id: u64, statement: u64)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        self.with_statement(ctx, statement, |s| {
            if s.open_stage != id {
                return;
            }
            s.open_stage = 0;
            if stack::current(self.id) == Some(statement) {
                pfs_client::end_stage();
            } else if !stack::holds(self.id, statement) {
                // Not entered on this thread: enter it to end the stage,
                // unless another thread has it entered (then the stage
                // ends with the next stage or the statement).
                if s.task.swap_in_unmeasured() {
                    pfs_client::end_stage();
                }
                s.task.swap_out();
            }
        });
    }
}

impl<S> tracing_subscriber::Layer<S> for PfsLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // Decide now, so that the first span pays nothing; never filter.
        let _ = self.site(meta);
        Interest::always()
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let meta = attrs.metadata();
        if !recording() {
            if matches!(&*self.site(meta), Role::Statement(_)) {
                not_recording_yet(meta.name());
            }
            return;
        }
        match &*self.site(meta) {
            Role::Statement(site) => {
                let Some(span) = ctx.span(id) else { return };
                let mut s = StatementSpan::boxed(site.rule);
                attrs.record(&mut SpanVisitor {
                    uses: &site.fields,
                    values: &mut s.values,
                    figures: &mut s.figures,
                });
                let mut ext = span.extensions_mut();
                let ours = Tagged {
                    layer: self.id,
                    span: PfsSpan::Statement(s),
                };
                // One lookup when the span is new to every `PfsLayer`.
                if let Some(theirs) = ext.replace(ours) {
                    // Another PfsLayer's: put it back.
                    if let Some(Tagged {
                        span: PfsSpan::Statement(s),
                        ..
                    }) = ext.replace(theirs)
                    {
                        drop(ext);
                        s.recycle();
                    }
                }
            }
            Role::Stage(site) => {
                let Some(span) = ctx.span(id) else { return };
                let Some(statement) = self.statement_at_or_above(span.parent()) else {
                    return; // a stage outside statements: not recorded
                };
                let class = *site
                    .class
                    .get_or_init(|| pfs_client::StageClass::register(&site.name));
                let mut ext = span.extensions_mut();
                if ext.get_mut::<Tagged>().is_none() {
                    ext.insert(Tagged {
                        layer: self.id,
                        span: PfsSpan::Stage(StageSpan {
                            statement,
                            class,
                            entered: false,
                        }),
                    });
                }
            }
            Role::Ignore | Role::Event(_) => {}
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if !recording() {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let found = self.site(span.metadata());
        let Role::Statement(site) = &*found else {
            return;
        };
        let mut ext = span.extensions_mut();
        if let Some(s) = self.statement_mut(&mut ext) {
            values.record(&mut SpanVisitor {
                uses: &site.fields,
                values: &mut s.values,
                figures: &mut s.figures,
            });
            // Its values may have changed.
            s.digest_set = false;
            s.text_set = false;
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !recording() {
            return;
        }
        let found = self.site(event.metadata());
        let Role::Event(site) = &*found else {
            return;
        };
        let Some(statement) = self.statement_at_or_above(ctx.event_span(event)) else {
            return;
        };
        self.with_statement(&ctx, statement, |s| {
            event.record(&mut EventVisitor {
                uses: &site.figures[s.rule],
                figures: &mut s.figures,
            });
        });
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if !recording() {
            return; // nothing was tagged (and never will be, before init)
        }
        let Some(span) = ctx.span(id) else { return };
        let site = self.site(span.metadata());
        if !matches!(&*site, Role::Statement(_) | Role::Stage(_)) {
            return; // never tagged: spare the extensions' lock
        }
        let mut ext = span.extensions_mut();
        let Some(tagged) = ext.get_mut::<Tagged>().filter(|t| t.layer == self.id) else {
            return;
        };
        match &mut tagged.span {
            PfsSpan::Statement(s)
                if s.task.is_entered()
                    && blocking::may_wait()
                    && !stack::holds(self.id, id.into_u64()) =>
            {
                // `enter_blocking` on a blocking thread, the span still
                // entered where the request is polled: wait for it there,
                // the extensions unlocked (its exit takes them).
                drop(ext);
                blocking::wait_until_free(|| {
                    span.extensions().get::<Tagged>().is_some_and(
                        |t| matches!(&t.span, PfsSpan::Statement(s) if s.task.is_entered()),
                    )
                });
                let mut ext = span.extensions_mut();
                if let Some(Tagged {
                    span: PfsSpan::Statement(s),
                    ..
                }) = ext.get_mut::<Tagged>().filter(|t| t.layer == self.id)
                {
                    self.enter_statement(id.into_u64(), &site, s);
                }
            }
            PfsSpan::Statement(s) => self.enter_statement(id.into_u64(), &site, s),
            PfsSpan::Stage(st) => {
                let first = !st.entered;
                st.entered = true;
                let (statement, class) = (st.statement, st.class);
                drop(ext);
                let source = match &*site {
                    Role::Stage(stage) => stage.source,
                    _ => None,
                };
                let id = id.into_u64();
                if stack::current(self.id) == Some(statement) {
                    if first {
                        self.with_statement(&ctx, statement, |s| {
                            class.enter_at(source);
                            s.open_stage = id;
                        });
                    } else if stack::contains(self.id, id) {
                        // Entered again inside its own enter away from its
                        // statement: counted, so that its exit pops this
                        // one, not the enter that holds the context.
                        stack::enter(self.id, id, statement, || false);
                    }
                    return;
                }
                // Entered where its statement is not current (work spawned
                // from inside the stage carries the stage span): take the
                // statement's context here, as its span's enter would, so
                // that what is recorded nests in the statement (in this
                // stage, while it is the statement's open stage); opened
                // then if it never was. Nothing if another thread has the
                // context entered.
                let mut opened = false;
                self.with_statement(&ctx, statement, |s| {
                    if s.stmt.is_some()
                        && stack::enter(self.id, id, statement, || s.task.swap_in())
                        && first
                    {
                        class.enter_at(source);
                        s.open_stage = id;
                        opened = true;
                    }
                });
                if first && !opened {
                    // Not opened (its statement's context is entered
                    // elsewhere: on another thread, or here below another
                    // statement's): opened at a later enter that can.
                    if let Some(Tagged {
                        span: PfsSpan::Stage(st),
                        ..
                    }) = span
                        .extensions_mut()
                        .get_mut::<Tagged>()
                        .filter(|t| t.layer == self.id)
                    {
                        st.entered = false;
                    }
                }
            }
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        // Only statement spans, and stage spans entered away from their
        // statement, are on the stack: any other span costs this lookup
        // in a thread-local vector of the spans entered here.
        self.undo(&ctx, stack::exit(self.id, id.into_u64()));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if !recording() {
            return;
        }
        let Some(span) = ctx.span(&id) else { return };
        if !self.may_be_tagged(span.metadata()) {
            return;
        }
        let id = id.into_u64();
        if stack::contains(self.id, id) {
            // Only this layer's spans are on the stack.
            self.unstack_closed(&ctx, id);
        }
        // Taken out (a few words: a statement is boxed), with one lookup.
        let mut ext = span.extensions_mut();
        let tagged = match ext.remove::<Tagged>() {
            Some(t) if t.layer == self.id => t,
            Some(theirs) => return ext.insert(theirs), // another PfsLayer's
            None => return,
        };
        drop(ext);
        match tagged.span {
            PfsSpan::Statement(mut s) => {
                self.close_statement(&mut s);
                s.recycle(); // its box, for the next statement span
            }
            PfsSpan::Stage(st) => {
                drop(span);
                if st.entered {
                    self.close_stage(&ctx, id, st.statement);
                }
            }
        }
    }
}
