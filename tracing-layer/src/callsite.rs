//! Layer 2. Per-callsite decisions: what the rules make of the spans and
//! events of one callsite (a statement, a stage, an event carrying figures,
//! or nothing), and, for each of its fields, which value slot or figure it
//! feeds. Decided once per callsite and kept in a table read without
//! locks, so that a span the rules ignore costs one lookup.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use pfs_client::{CallSite, StageClass, StatementClass};
use tracing_core::Metadata;

use crate::rules::{Figure, Rules};

/// What one field of a statement span feeds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldUse {
    /// The value slot (a field the rule's templates refer to).
    pub(crate) value: Option<u8>,
    /// The figure it carries.
    pub(crate) figure: Option<Figure>,
}

/// A statement span callsite.
#[derive(Debug)]
pub(crate) struct StatementSite {
    /// Index of the rule in `Rules::statements`.
    pub(crate) rule: usize,
    /// By field index of the callsite.
    pub(crate) fields: Box<[FieldUse]>,
    /// The class name, if it does not depend on field values.
    pub(crate) static_name: Option<String>,
    /// Its class, registered on first use after `init`.
    pub(crate) class: OnceLock<StatementClass>,
    /// The span's callsite, its statements' `SOURCE` (none if its
    /// metadata has no file and line).
    pub(crate) source: Option<&'static dyn pfs_client::Site>,
}

/// A stage span callsite.
#[derive(Debug)]
pub(crate) struct StageSite {
    pub(crate) name: String,
    /// Registered on first use after `init`.
    pub(crate) class: OnceLock<StageClass>,
    /// The span's callsite, its stages' `SOURCE` (as a statement's).
    pub(crate) source: Option<&'static dyn pfs_client::Site>,
}

/// The [`CallSite`] of a span's callsite (`SOURCE` `file:line` of the
/// `span!`), if its metadata has a file and a line: one per callsite for
/// the process (callsites are `'static`, so they are bounded by the
/// program), shared by every layer, made once.
fn call_site(meta: &'static Metadata<'static>) -> Option<&'static dyn pfs_client::Site> {
    static SITES: OnceLock<Mutex<HashMap<usize, &'static CallSite>>> = OnceLock::new();
    let (file, line) = (meta.file()?, meta.line()?);
    let mut sites = SITES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = meta as *const Metadata<'static> as usize;
    let site: &'static CallSite = sites
        .entry(key)
        .or_insert_with(|| Box::leak(Box::new(CallSite::new(file, line))));
    Some(site)
}

/// An event callsite with fields that some statement rule counts.
#[derive(Debug)]
pub(crate) struct EventSite {
    /// By statement rule, then by field index.
    pub(crate) figures: Box<[Box<[Option<Figure>]>]>,
}

/// The decision for one callsite.
#[derive(Debug)]
pub(crate) enum Role {
    /// Neither a statement, a stage, nor an event with figures.
    Ignore,
    Statement(StatementSite),
    Stage(StageSite),
    Event(EventSite),
}

impl Role {
    /// Applies `rules` to the callsite of `meta`.
    pub(crate) fn decide(meta: &'static Metadata<'static>, rules: &Rules) -> Role {
        let fields = meta.fields();
        if meta.is_span() {
            if let Some((i, r)) = rules
                .statements
                .iter()
                .enumerate()
                .find(|(_, r)| r.matcher.matches(meta))
            {
                let uses = fields
                    .iter()
                    .map(|f| FieldUse {
                        value: r.value_slot(f.name()),
                        figure: r.figure_of(f.name()),
                    })
                    .collect();
                return Role::Statement(StatementSite {
                    rule: i,
                    fields: uses,
                    static_name: r.static_class(meta.name()),
                    class: OnceLock::new(),
                    source: call_site(meta),
                });
            }
            if let Some(r) = rules.stages.iter().find(|r| r.matcher.matches(meta)) {
                return Role::Stage(StageSite {
                    name: r.class_name(meta.name()),
                    class: OnceLock::new(),
                    source: call_site(meta),
                });
            }
            return Role::Ignore;
        }
        let figures: Box<[Box<[Option<Figure>]>]> = rules
            .statements
            .iter()
            .map(|r| fields.iter().map(|f| r.figure_of(f.name())).collect())
            .collect();
        if figures.iter().flatten().any(Option::is_some) {
            Role::Event(EventSite { figures })
        } else {
            Role::Ignore
        }
    }
}

/// Slots in the table (a power of two). Past this many callsites seen,
/// decisions are made again at each lookup (correct, slower).
const SLOTS: usize = 4096;

struct Site {
    key: usize,
    role: Role,
}

/// The decisions, by callsite (the address of its static `Metadata`): an
/// open-addressing table whose slots are set once and never change, so a
/// lookup is a few plain loads, no lock and no shared write.
pub(crate) struct Sites {
    slots: Box<[OnceLock<Box<Site>>]>,
}

impl std::fmt::Debug for Sites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.slots.iter().filter(|s| s.get().is_some()).count();
        f.debug_struct("Sites").field("used", &used).finish()
    }
}

/// A decision: from the table, or made for this lookup only (table full).
pub(crate) enum Found<'a> {
    Cached(&'a Role),
    Fresh(Role),
}

impl std::ops::Deref for Found<'_> {
    type Target = Role;
    #[inline]
    fn deref(&self) -> &Role {
        match self {
            Found::Cached(r) => r,
            Found::Fresh(r) => r,
        }
    }
}

impl Sites {
    pub(crate) fn new() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The decision for `meta`'s callsite, made by `decide` on first sight.
    #[inline]
    pub(crate) fn get(
        &self,
        meta: &'static Metadata<'static>,
        decide: impl FnOnce() -> Role,
    ) -> Found<'_> {
        let key = std::ptr::from_ref(meta) as usize;
        let mut i = slot_of(key);
        for _ in 0..SLOTS {
            match self.slots[i].get() {
                Some(s) if s.key == key => return Found::Cached(&s.role),
                Some(_) => i = (i + 1) & (SLOTS - 1),
                None => return self.insert(i, key, decide),
            }
        }
        Found::Fresh(decide())
    }

    #[cold]
    fn insert(&self, mut i: usize, key: usize, decide: impl FnOnce() -> Role) -> Found<'_> {
        let mut new = Some(Box::new(Site {
            key,
            role: decide(),
        }));
        for _ in 0..SLOTS {
            let s = self.slots[i].get_or_init(|| new.take().expect("set once"));
            if s.key == key {
                return Found::Cached(&s.role);
            }
            i = (i + 1) & (SLOTS - 1);
        }
        Found::Fresh(new.expect("not placed").role)
    }
}

#[inline]
fn slot_of(key: usize) -> usize {
    let h = (key as u64 >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> (64 - SLOTS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{SpanMatch, StageRule, StatementRule};

    /// A leaked callsite metadata (spans of a test without subscriber
    /// have none).
    fn meta(
        name: &str,
        fields: &'static [&'static str],
        kind: tracing_core::metadata::Kind,
    ) -> &'static Metadata<'static> {
        let name: &'static str = Box::leak(name.to_string().into_boxed_str());
        Box::leak(Box::new(Metadata::new(
            name,
            "t",
            tracing::Level::INFO,
            None,
            None,
            None,
            tracing_core::field::FieldSet::new(fields, tracing_core::identify_callsite!(&CS)),
            kind,
        )))
    }

    /// The callsite the test metadata names (its identity only matters).
    struct Cs;
    impl tracing_core::Callsite for Cs {
        fn set_interest(&self, _: tracing_core::Interest) {}
        fn metadata(&self) -> &tracing_core::Metadata<'_> {
            &CS_META
        }
    }
    static CS: Cs = Cs;
    static CS_META: Metadata<'static> = Metadata::new(
        "cs",
        "t",
        tracing::Level::INFO,
        None,
        None,
        None,
        tracing_core::field::FieldSet::new(&[], tracing_core::identify_callsite!(&CS)),
        tracing_core::metadata::Kind::SPAN,
    );

    const SPAN: tracing_core::metadata::Kind = tracing_core::metadata::Kind::SPAN;

    #[test]
    fn decisions_per_callsite() {
        let rules = Rules {
            statements: vec![StatementRule::http()],
            stages: vec![StageRule::new(SpanMatch::name("lookup"), "app")],
        };
        let sites = Sites::new();
        let req = meta("request", &["method", "uri", "route", "other"], SPAN);
        let mut decided = 0;
        for _ in 0..2 {
            let r = sites.get(req, || {
                decided += 1;
                Role::decide(req, &rules)
            });
            let Role::Statement(s) = &*r else {
                panic!("a statement: {:?}", *r)
            };
            assert_eq!(s.rule, 0);
            assert_eq!(s.static_name, None);
            let uses: Vec<_> = s.fields.iter().map(|u| (u.value, u.figure)).collect();
            // Slots: the class template's names first (method 0, route 2), then the text's (uri 5).
            assert_eq!(
                uses,
                [
                    (Some(0), None),
                    (Some(5), None),
                    (Some(2), None),
                    (None, None)
                ]
            );
        }
        assert_eq!(decided, 1, "decided once");
        let no_method = meta("request", &["uri"], SPAN);
        assert!(matches!(Role::decide(no_method, &rules), Role::Ignore));
        match Role::decide(meta("lookup", &[], SPAN), &rules) {
            Role::Stage(s) => assert_eq!(s.name, "stage/app/lookup"),
            r => panic!("a stage: {r:?}"),
        }
        let ev = meta(
            "e",
            &["status", "latency"],
            tracing_core::metadata::Kind::EVENT,
        );
        match Role::decide(ev, &rules) {
            Role::Event(e) => assert_eq!(&*e.figures[0], &[Some(Figure::Status), None]),
            r => panic!("an event with figures: {r:?}"),
        }
        let plain = meta("e", &["message"], tracing_core::metadata::Kind::EVENT);
        assert!(matches!(Role::decide(plain, &rules), Role::Ignore));
    }

    #[test]
    fn a_full_table_still_answers() {
        let sites = Sites::new();
        let rules = Rules::default();
        let metas: Vec<&'static Metadata<'static>> = (0..SLOTS + 10)
            .map(|i| meta(&format!("s{i}"), &[], SPAN))
            .collect();
        for m in &metas {
            assert!(matches!(
                *sites.get(m, || Role::decide(m, &rules)),
                Role::Ignore
            ));
        }
        let last = metas.last().unwrap();
        assert!(matches!(sites.get(last, || Role::Ignore), Found::Fresh(_)));
        assert!(matches!(
            sites.get(metas[0], || unreachable!()),
            Found::Cached(_)
        ));
    }
}
