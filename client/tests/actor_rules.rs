//! `setup_actors` rows a process starts with (`Config::actor`, as
//! `PFS_ACTORS` gives them): a thread that declares its actor at once,
//! before any agent could change the table, gets its verdict from them.
//! One test function: `init` is once per process.

use pfs_client::{ActorRule, Config, ConfigError, parse_actor_rules};

#[test]
fn actor_rules_apply_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::new("actors").shm_dir(dir.path());
    for rule in parse_actor_rules("batch@%=OFF; %@db-2=NO_HISTORY").unwrap() {
        cfg = cfg.actor(rule);
    }
    pfs_client::init_with(cfg).unwrap();
    // The most specific row decides, as in MySQL: the host first (each
    // field a name or `%`, not a pattern).
    let verdict = |user: &'static str, host: &'static str| {
        std::thread::spawn(move || pfs_client::set_thread_actor(user, host, "%"))
            .join()
            .unwrap()
    };
    assert_eq!(verdict("batch", "web-1"), (false, false));
    assert_eq!(verdict("alice", "db-2"), (true, false));
    assert_eq!(verdict("alice", "web-1"), (true, true), "the default row");

    // More rows than the table holds, or a field too long, are refused.
    let rule = |i: usize, user: String| ActorRule {
        host: format!("h{i}"),
        user,
        role: "%".into(),
        enabled: false,
        history: false,
    };
    let mut big = Config::new("big").shm_dir(dir.path());
    for i in 0..48 {
        big = big.actor(rule(i, "u".into()));
    }
    assert!(
        matches!(
            big.validate(),
            Err(ConfigError::TooManyActors { given: 48, max: 47 })
        ),
        "{:?}",
        big.validate()
    );
    let long = Config::new("long")
        .shm_dir(dir.path())
        .actor(rule(0, "u".repeat(33)));
    let e = long.validate().unwrap_err().to_string();
    assert!(e.contains("USER@HOST"), "{e}");
}
