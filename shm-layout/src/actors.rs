//! `setup_actors` rows: writing and clearing a row under its sequence
//! lock, the decoded row ([`Actor`]), and PFS's rule that picks the row
//! that applies to a thread ([`match_actor`]). The segment's creator writes
//! the default row with these; the agent edits rows through the `setup`
//! module, which re-exports them.
//!
//! Layer 2 (see the crate docs): depends on [`crate::layout`] (the row)
//! and [`crate::text`] (its strings).

use std::sync::atomic::Ordering::Relaxed;

use crate::layout::{ACTOR_FIELD_BYTES, ACTOR_USED, ActorEntry};
use crate::text::{store_bytes, truncate_utf8};

/// One `setup_actors` row, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// `HOST` or `%`.
    pub host: String,
    /// `USER` or `%`.
    pub user: String,
    /// `ROLE` or `%`.
    pub role: String,
    /// `ENABLED`.
    pub enabled: bool,
    /// `HISTORY`.
    pub history: bool,
}

/// Writes an actor row under its sequence lock (single writer: the
/// creator at creation, then the agent).
pub fn write_actor(e: &ActorEntry, host: &str, user: &str, role: &str, flags: u32) {
    let _w = e.seq.write();
    store_bytes(
        &e.host,
        &e.host_len,
        truncate_utf8(host, ACTOR_FIELD_BYTES).as_bytes(),
    );
    store_bytes(
        &e.user,
        &e.user_len,
        truncate_utf8(user, ACTOR_FIELD_BYTES).as_bytes(),
    );
    store_bytes(
        &e.role,
        &e.role_len,
        truncate_utf8(role, ACTOR_FIELD_BYTES).as_bytes(),
    );
    e.flags.store(flags | ACTOR_USED, Relaxed);
}

/// Clears an actor row.
pub fn clear_actor(e: &ActorEntry) {
    let _w = e.seq.write();
    e.flags.store(0, Relaxed);
}

/// PFS's rule for a thread that declares `user`@`host` with `role`: the
/// most specific matching row decides (a literal beats `%`, compared on
/// host, then user, then role). No matching row: not instrumented.
/// Returns `(INSTRUMENTED, HISTORY)`, the row's `ENABLED` and `HISTORY`
/// each as it is (a thread not instrumented records nothing, whatever its
/// `HISTORY`).
pub fn match_actor(actors: &[Actor], user: &str, host: &str, role: &str) -> (bool, bool) {
    let fits = |pat: &str, v: &str| pat == "%" || pat == v;
    actors
        .iter()
        .filter(|a| fits(&a.host, host) && fits(&a.user, user) && fits(&a.role, role))
        .max_by_key(|a| (a.host != "%", a.user != "%", a.role != "%"))
        .map(|a| (a.enabled, a.history))
        .unwrap_or((false, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_specificity() {
        let a = |h: &str, u: &str, e: bool| Actor {
            host: h.into(),
            user: u.into(),
            role: "%".into(),
            enabled: e,
            history: true,
        };
        let rows = vec![
            a("%", "%", true),
            a("%", "batch", false),
            a("db1", "%", true),
        ];
        assert_eq!(match_actor(&rows, "web", "h", ""), (true, true));
        assert_eq!(
            match_actor(&rows, "batch", "h", ""),
            (false, true),
            "HISTORY is the row's, as in MySQL"
        );
        assert_eq!(
            match_actor(&rows, "batch", "db1", ""),
            (true, true),
            "host is compared first"
        );
        assert_eq!(match_actor(&[], "x", "y", ""), (false, false));
    }
}
