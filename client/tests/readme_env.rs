//! The README's list of `PFS_*` sizes says each one's default and the
//! values `init` accepts, as `` `PFS_X` (default, low to high ``: this
//! test reads that list and checks it against `Config`, and that
//! `Config::from_env` accepts exactly those ends (one below or above is
//! `InitError::BadEnv`), so the README cannot drift from the code.

use std::ops::RangeInclusive;

use pfs_client::{Config, InitError};

/// Each documented size: its variable, its default and its range.
fn sizes() -> Vec<(&'static str, u32, RangeInclusive<u32>)> {
    let d = Config::new("readme");
    vec![
        ("PFS_HISTORY_SIZE", d.history_len, Config::HISTORY_LEN_RANGE),
        ("PFS_MAX_THREADS", d.max_threads, d.max_threads_range()),
        ("PFS_MAX_CLASSES", d.max_classes, Config::MAX_CLASSES_RANGE),
        ("PFS_MAX_STRINGS", d.max_strings, Config::MAX_STRINGS_RANGE),
        (
            "PFS_HISTORY_LONG_SIZE",
            d.history_long_len,
            Config::HISTORY_LONG_LEN_RANGE,
        ),
        ("PFS_TASK_SLOTS", d.task_slots, Config::TASK_SLOTS_RANGE),
    ]
}

/// What the README says of `var`: (default, low, high).
fn documented(readme: &str, var: &str) -> (u32, u32, u32) {
    let key = format!("`{var}` (");
    let at = readme
        .find(&key)
        .unwrap_or_else(|| panic!("README does not list {key}"));
    let rest = &readme[at + key.len()..];
    let num = |s: &str| -> (u32, usize) {
        let n = s.bytes().take_while(u8::is_ascii_digit).count();
        let v = s[..n]
            .parse()
            .unwrap_or_else(|_| panic!("{var}: no number at {:?}", &s[..s.len().min(30)]));
        (v, n)
    };
    let (default, n) = num(rest);
    let rest = rest[n..]
        .strip_prefix(", ")
        .unwrap_or_else(|| panic!("{var}: expected `(default, low to high`"));
    let (low, n) = num(rest);
    let rest = rest[n..]
        .strip_prefix(" to ")
        .unwrap_or_else(|| panic!("{var}: expected `low to high`"));
    let (high, _) = num(rest);
    (default, low, high)
}

#[test]
fn readme_sizes_are_the_code_s() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("read README.md");
    for (var, default, range) in sizes() {
        assert_eq!(
            documented(&readme, var),
            (default, *range.start(), *range.end()),
            "README's {var}: (default, low, high)"
        );
    }
}

#[test]
fn from_env_accepts_exactly_the_documented_range() {
    for (var, _, range) in sizes() {
        let parse = |v: u64| {
            // SAFETY: this test binary's tests that touch the environment
            // are this one only, and it sets and reads one variable at a
            // time from one thread; the other test reads a file.
            unsafe { std::env::set_var(var, v.to_string()) };
            let r = Config::from_env();
            // SAFETY: as above.
            unsafe { std::env::remove_var(var) };
            r
        };
        for ok in [*range.start(), *range.end()] {
            assert!(parse(u64::from(ok)).is_ok(), "{var}={ok} is in range");
        }
        let below = u64::from(*range.start()).checked_sub(1);
        for bad in below.into_iter().chain([u64::from(*range.end()) + 1]) {
            assert!(
                matches!(parse(bad), Err(InitError::BadEnv(ref k, _)) if k == var),
                "{var}={bad} is refused"
            );
        }
    }
}
