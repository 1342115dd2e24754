//! Live setup, shared by both sides: `setup_instruments` (class flags),
//! `setup_consumers` (a bitmask word), `setup_timers` (a packed word) and
//! `setup_actors` (rows). The agent (or `pfs-agent setup`) changes them in
//! place; writers read them on every event with one relaxed load each, so a
//! change takes effect at the next event. Updates are atomic
//! read-modify-writes, so two agents changing different bits never lose
//! each other's change.
//!
//! ```
//! use pfs_shm_layout::setup::like;
//! assert!(like("wait/synch/%", "wait/synch/mutex/kv/lock"));
//! assert!(like("wait/io/file/kv/wa_", "wait/io/file/kv/wal"));
//! assert!(!like("wait/synch/%", "stage/kv/parsing"));
//! ```
//!
//! Layer 4 (see the crate docs): works on a mapped [`crate::segment`];
//! the `setup_actors` row format is [`crate::actors`]'s.

use std::sync::atomic::Ordering::*;

use crate::kinds::EventKind;
use crate::layout::*;
use crate::segment::Segment;
use crate::text::load_string;

// Moved to `actors` (below `segment`, which writes the default row at
// creation); re-exported at their old paths.
pub use crate::actors::{Actor, clear_actor, match_actor, write_actor};

/// SQL `LIKE`: `%` matches any run of characters, `_` exactly one, `\`
/// escapes the next character. Case-sensitive, as instrument names are.
pub fn like(pattern: &str, s: &str) -> bool {
    fn go(p: &[char], s: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some('%') => (0..=s.len()).any(|i| go(&p[1..], &s[i..])),
            Some('_') => !s.is_empty() && go(&p[1..], &s[1..]),
            Some('\\') if p.len() > 1 => s.first() == Some(&p[1]) && go(&p[2..], &s[1..]),
            Some(c) => s.first() == Some(c) && go(&p[1..], &s[1..]),
        }
    }
    // Collapse runs of `%` so the recursion stays linear in practice.
    let mut p: Vec<char> = Vec::with_capacity(pattern.len());
    for c in pattern.chars() {
        if c == '%' && p.last() == Some(&'%') {
            continue;
        }
        p.push(c);
    }
    let s: Vec<char> = s.chars().collect();
    go(&p, &s)
}

/// Checks that every consumer rule's pattern names a consumer: a typo
/// (`events_wait_%`) would otherwise change nothing, silently.
///
/// ```
/// use pfs_shm_layout::setup::check_consumer_rules;
/// assert!(check_consumer_rules(&[("events_waits_history%".into(), true)]).is_ok());
/// assert!(check_consumer_rules(&[("nosuch".into(), true)]).is_err());
/// ```
pub fn check_consumer_rules(rules: &[(String, bool)]) -> Result<(), crate::rules::SyntaxError> {
    let all = consumers();
    for (pattern, on) in rules {
        if !all.iter().any(|(n, _)| like(pattern, n)) {
            let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
            return Err(crate::rules::SyntaxError::NoSuchConsumer {
                rule: format!("{pattern}={}", if *on { "ON" } else { "OFF" }),
                pattern: pattern.clone(),
                names: names.join(", "),
            });
        }
    }
    Ok(())
}

/// The `setup_consumers` rows: name and bit, in PFS order.
pub fn consumers() -> Vec<(String, u32)> {
    let mut v = Vec::new();
    for k in EventKind::ALL {
        let kind = k.table_word();
        v.push((
            format!("events_{kind}_current"),
            consumer_bit(k, ConsumerKind::Current),
        ));
        v.push((
            format!("events_{kind}_history"),
            consumer_bit(k, ConsumerKind::History),
        ));
        v.push((
            format!("events_{kind}_history_long"),
            consumer_bit(k, ConsumerKind::HistoryLong),
        ));
        v.push((
            format!("events_{kind}_summaries"),
            consumer_bit(k, ConsumerKind::Summaries),
        ));
    }
    v.push(("events_statements_cpu".into(), CONSUMER_STATEMENTS_CPU));
    v.push(("global_instrumentation".into(), CONSUMER_GLOBAL));
    v.push(("thread_instrumentation".into(), CONSUMER_THREAD));
    v
}

/// Whether task statements' poll time (`CPU_TIME`) is measured under
/// consumers `word`: `events_statements_cpu` and `global_instrumentation`.
#[inline(always)]
pub const fn statements_cpu(word: u32) -> bool {
    word & (CONSUMER_GLOBAL | CONSUMER_STATEMENTS_CPU) == CONSUMER_GLOBAL | CONSUMER_STATEMENTS_CPU
}

/// The `setup_consumers` word of `seg` as it acts: with
/// `events_statements_cpu` on for a writer older than 6.2 (5.x, 6.0,
/// 6.1), which measures poll time whatever the bit says.
pub fn consumers_in_effect(seg: &Segment) -> u32 {
    let word = seg.setup().consumers.load(Relaxed);
    if cpu_always(seg) {
        word | CONSUMER_STATEMENTS_CPU
    } else {
        word
    }
}

/// Whether `seg`'s writer predates `events_statements_cpu` (layout 6.2)
/// and measures task poll time always.
fn cpu_always(seg: &Segment) -> bool {
    let (major, minor) = (seg.major_version(), seg.minor_version());
    major < 6 || (major == 6 && minor < 2)
}

/// Whether consumer `which` of event kind `kind` is in effect, applying
/// PFS's hierarchy: nothing without `global_instrumentation`; the current
/// and history tables also need `thread_instrumentation`; the history
/// tables also need their kind's `current` consumer. Summaries need only
/// `global_instrumentation` and their own consumer: the global summaries
/// are sums of the per-thread rows, so those keep counting (and
/// `*_summary_by_thread_*` shows them) with `thread_instrumentation` off.
/// One test of a [`Plan`].
#[inline(always)]
pub const fn effective(word: u32, kind: EventKind, which: ConsumerKind) -> bool {
    Plan::new(word, kind).has(which)
}

/// The consumers in effect for one event kind: [`effective`] for all four
/// at once, from one `setup_consumers` word, by one load from a table
/// built at compile time from the hierarchy written once; then each
/// consumer is one bit test. A writer makes one per event end instead of
/// applying the hierarchy four times.
///
/// ```
/// use pfs_shm_layout::EventKind;
/// use pfs_shm_layout::layout::{CONSUMERS_DEFAULT, ConsumerKind};
/// use pfs_shm_layout::setup::Plan;
///
/// let waits = Plan::new(CONSUMERS_DEFAULT, EventKind::Wait);
/// assert!(waits.has(ConsumerKind::History));
/// assert!(!waits.has(ConsumerKind::HistoryLong)); // off by default
/// assert!(!waits.without_history().has(ConsumerKind::History));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan(u32);

impl Plan {
    /// Bit of `which` in a plan (the consumer kinds' order).
    const fn bit(which: ConsumerKind) -> u32 {
        1 << which as u32
    }

    /// The histories: what a thread with `HISTORY = NO` does not write.
    const HISTORIES: u32 = Self::bit(ConsumerKind::History) | Self::bit(ConsumerKind::HistoryLong);

    /// The hierarchy applied to a kind's four consumer bits `own` (in
    /// `ConsumerKind` order) and the `global` and `thread` switches.
    const fn rule(own: u32, global: bool, thread: bool) -> u32 {
        if !global {
            return 0;
        }
        // Every per-thread table but the summaries (the source of the
        // global ones) needs thread_instrumentation...
        let mut keep = if thread {
            0xF
        } else {
            Self::bit(ConsumerKind::Summaries)
        };
        // ...and the histories need their kind's current table.
        if own & Self::bit(ConsumerKind::Current) == 0 {
            keep &= !Self::HISTORIES;
        }
        own & keep
    }

    /// [`Plan::rule`] for every index `global | thread << 1 | own << 2`
    /// (the consumers word's two switches are its bits 0 and 1).
    const TABLE: [u8; 64] = {
        let mut t = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            t[i] = Self::rule(i as u32 >> 2, i & 1 != 0, i & 2 != 0) as u8;
            i += 1;
        }
        t
    };

    /// The plan of kind `kind` under consumers word `word`: a shift, two
    /// masks and a table load.
    #[inline(always)]
    pub const fn new(word: u32, kind: EventKind) -> Self {
        const _: () = assert!(CONSUMER_GLOBAL == 1 && CONSUMER_THREAD == 2);
        // The kind's four consumer bits, in `ConsumerKind` order.
        let own = (word >> consumer_bit(kind, ConsumerKind::Current).trailing_zeros()) & 0xF;
        let switches = word & (CONSUMER_GLOBAL | CONSUMER_THREAD);
        Self(Self::TABLE[(switches | own << 2) as usize] as u32)
    }

    /// Whether consumer `which` is in effect.
    #[inline(always)]
    pub const fn has(self, which: ConsumerKind) -> bool {
        self.0 & Self::bit(which) != 0
    }

    /// The plan for a thread whose `HISTORY` is `NO`: no history rings.
    #[inline(always)]
    pub const fn without_history(self) -> Self {
        Self(self.0 & !Self::HISTORIES)
    }
}

/// Reads the actor rows that exist (rows that cannot be read consistently
/// or hold invalid UTF-8 are skipped).
pub fn read_actors(seg: &Segment) -> Vec<Actor> {
    seg.setup()
        .actors
        .iter()
        .filter_map(|e| {
            e.seq
                .read(64, || {
                    let flags = e.flags.load(Relaxed);
                    if flags & ACTOR_USED == 0 {
                        return None;
                    }
                    Some(Actor {
                        host: load_string(&e.host, e.host_len.load(Relaxed))?,
                        user: load_string(&e.user, e.user_len.load(Relaxed))?,
                        role: load_string(&e.role, e.role_len.load(Relaxed))?,
                        enabled: flags & ACTOR_ENABLED != 0,
                        history: flags & ACTOR_HISTORY != 0,
                    })
                })
                .value
                .flatten()
        })
        .collect()
}

/// Sets ENABLED and/or TIMED on every class whose name matches the `LIKE`
/// pattern; returns how many matched. Needs a writable mapping.
pub fn set_instruments(
    seg: &Segment,
    pattern: &str,
    enabled: Option<bool>,
    timed: Option<bool>,
) -> usize {
    let mut matched = 0;
    for e in seg.classes() {
        if e.state.load(Acquire) != CLASS_READY {
            continue;
        }
        let Some(name) = load_string(&e.name, e.name_len.load(Relaxed)) else {
            continue;
        };
        if !like(pattern, &name) {
            continue;
        }
        matched += 1;
        apply_flag(&e.flags, FLAG_ENABLED, enabled);
        apply_flag(&e.flags, FLAG_TIMED, timed);
    }
    matched
}

fn apply_flag(word: &std::sync::atomic::AtomicU32, bit: u32, v: Option<bool>) {
    match v {
        Some(true) => {
            word.fetch_or(bit, Relaxed);
        }
        Some(false) => {
            word.fetch_and(!bit, Relaxed);
        }
        None => {}
    }
}

/// Enables or disables every consumer whose name matches the pattern;
/// returns how many matched. A writer older than 6.2 has no
/// `events_statements_cpu` to switch (it measures always): there it
/// matches nothing.
pub fn set_consumers(seg: &Segment, pattern: &str, enabled: bool) -> usize {
    let fixed = if cpu_always(seg) {
        CONSUMER_STATEMENTS_CPU
    } else {
        0
    };
    let matched: Vec<u32> = consumers()
        .into_iter()
        .filter(|&(ref n, b)| b & fixed == 0 && like(pattern, n))
        .map(|(_, b)| b)
        .collect();
    let bits = matched.iter().fold(0, |a, b| a | b);
    apply_flag(&seg.setup().consumers, bits, Some(enabled));
    matched.len()
}

/// Sets the timer of every event kind whose [`EventKind::name`]
/// matches `pattern` (`wait`, `stage`, `statement`, or `%`); returns how
/// many matched.
pub fn set_timers(seg: &Segment, pattern: &str, timer: TimerId) -> usize {
    let w = &seg.setup().timers;
    let mut matched = 0;
    for k in EventKind::ALL {
        if like(pattern, k.name()) {
            matched += 1;
            let shift = 3 * k.index() as u32;
            let _ = w.fetch_update(Relaxed, Relaxed, |v| {
                Some((v & !(7 << shift)) | ((timer as u32) << shift))
            });
        }
    }
    matched
}

/// The agent's setup defaults recorded in the segment (since layout 5.1):
/// `(fingerprint, classes covered)`, `(0, 0)` if none were applied.
pub fn agent_defaults(seg: &Segment) -> (u32, u32) {
    let w = seg.setup().agent_defaults.load(Acquire);
    ((w >> 32) as u32, w as u32)
}

/// Records that the setup defaults of `fingerprint` were applied to the
/// segment, its classes `0..classes` included.
pub fn set_agent_defaults(seg: &Segment, fingerprint: u32, classes: u32) {
    seg.setup()
        .agent_defaults
        .store((u64::from(fingerprint) << 32) | u64::from(classes), Release);
}

/// Why a `setup_actors` row could not be inserted: every one of its
/// [`MAX_ACTORS`] rows is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("setup_actors is full ({MAX_ACTORS} rows): delete a row before inserting another")]
pub struct ActorsFull;

/// Inserts, updates (`Some((enabled, history))`) or deletes (`None`) the
/// `setup_actors` row (`host`, `user`, `role`). An update changes the
/// columns given (`Some`) and keeps the others; a new row takes `YES` for
/// a column not given, as in MySQL. Returns the rows changed (0 or 1), or
/// [`ActorsFull`] if a new row has no room.
pub fn set_actor(
    seg: &Segment,
    host: &str,
    user: &str,
    role: &str,
    flags: Option<(Option<bool>, Option<bool>)>,
) -> Result<usize, ActorsFull> {
    let setup = seg.setup();
    let same = |e: &ActorEntry| {
        e.flags.load(Relaxed) & ACTOR_USED != 0
            && load_string(&e.host, e.host_len.load(Relaxed)).as_deref() == Some(host)
            && load_string(&e.user, e.user_len.load(Relaxed)).as_deref() == Some(user)
            && load_string(&e.role, e.role_len.load(Relaxed)).as_deref() == Some(role)
    };
    let existing = setup.actors.iter().find(|e| same(e));
    let changed = match (flags, existing) {
        (None, Some(e)) => {
            clear_actor(e);
            1
        }
        (None, None) => 0,
        (Some((enabled, history)), e) => {
            // An existing row's columns, or a new row's defaults.
            let old = e.map_or(ACTOR_ENABLED | ACTOR_HISTORY, |e| e.flags.load(Relaxed));
            let Some(e) = e.or_else(|| {
                setup
                    .actors
                    .iter()
                    .find(|e| e.flags.load(Relaxed) & ACTOR_USED == 0)
            }) else {
                return Err(ActorsFull);
            };
            let bit = |given: Option<bool>, bit: u32| match given {
                Some(true) => bit,
                Some(false) => 0,
                None => old & bit,
            };
            write_actor(
                e,
                host,
                user,
                role,
                bit(enabled, ACTOR_ENABLED) | bit(history, ACTOR_HISTORY),
            );
            1
        }
    };
    setup.actors_version.fetch_add(1, Release);
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_semantics() {
        assert!(like("%", ""));
        assert!(like("wait/%", "wait/synch/mutex/a"));
        assert!(like("%mutex%", "wait/synch/mutex/a"));
        assert!(!like("wait/_", "wait/ab"));
        assert!(like("a\\%b", "a%b"));
        assert!(!like("a\\%b", "axb"));
        assert!(like("%%%a", "bbba"));
    }

    #[test]
    fn consumer_hierarchy() {
        let w = CONSUMERS_DEFAULT;
        let wait = EventKind::Wait;
        assert!(effective(w, wait, ConsumerKind::History));
        assert!(
            !effective(w, wait, ConsumerKind::HistoryLong),
            "off by default"
        );
        let no_current = w & !consumer_bit(wait, ConsumerKind::Current);
        assert!(
            !effective(no_current, wait, ConsumerKind::History),
            "history needs current"
        );
        assert!(effective(no_current, wait, ConsumerKind::Summaries));
        assert!(!effective(
            w & !CONSUMER_GLOBAL,
            EventKind::Statement,
            ConsumerKind::Summaries
        ));
        assert_eq!(consumers().len(), 15);
        // events_statements_cpu: on by default, under global_instrumentation,
        // and outside every kind's plan.
        assert!(statements_cpu(w));
        assert!(!statements_cpu(w & !CONSUMER_GLOBAL));
        assert!(!statements_cpu(w & !CONSUMER_STATEMENTS_CPU));
        for kind in EventKind::ALL {
            assert_eq!(
                Plan::new(w, kind),
                Plan::new(w & !CONSUMER_STATEMENTS_CPU, kind)
            );
        }
    }

    #[test]
    fn plan_applies_the_hierarchy_to_every_word() {
        // The plan against the hierarchy written out, for every
        // combination of the global, thread and one kind's four bits.
        use ConsumerKind::*;
        for kind in EventKind::ALL {
            for combo in 0u32..64 {
                let own: u32 = (0..4)
                    .filter(|i| combo & (1 << i) != 0)
                    .map(|i| consumer_bit(kind, [Current, History, HistoryLong, Summaries][i]))
                    .sum();
                let global = if combo & 16 != 0 { CONSUMER_GLOBAL } else { 0 };
                let thread = if combo & 32 != 0 { CONSUMER_THREAD } else { 0 };
                let word = own | global | thread;
                let on = |w: ConsumerKind| word & consumer_bit(kind, w) != 0;
                let g = global != 0;
                let t = thread != 0;
                let plan = Plan::new(word, kind);
                assert_eq!(plan.has(Summaries), g && on(Summaries), "{word:#x}");
                assert_eq!(plan.has(Current), g && t && on(Current), "{word:#x}");
                for h in [History, HistoryLong] {
                    assert_eq!(plan.has(h), g && t && on(Current) && on(h), "{word:#x}");
                    assert!(!plan.without_history().has(h));
                }
                assert_eq!(plan.without_history().has(Current), plan.has(Current));
                // Other kinds' bits do not leak in.
                let all_kinds = ((1 << (2 + 4 * 3)) - 1) & !3;
                let others = all_kinds & !(0xF << (2 + 4 * kind.index()));
                assert_eq!(Plan::new(word | others, kind), plan, "{word:#x}");
            }
        }
    }
}
