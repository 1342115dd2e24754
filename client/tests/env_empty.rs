//! A `PFS_*` variable set but empty (as a manifest renders a value left
//! blank) counts as unset: the default, not an error.

#[test]
fn empty_variables_are_unset() {
    let vars = [
        "PFS_SHM_DIR",
        "PFS_SERVICE_NAME",
        "PFS_HISTORY_SIZE",
        "PFS_MAX_THREADS",
        "PFS_GROUP_ACCESS",
        "PFS_RECLAIM_AFTER",
        "PFS_INSTRUMENT",
        "PFS_CONSUMERS",
        "PFS_ACTORS",
        "PFS_TASK_SLOTS",
    ];
    for (i, k) in vars.iter().enumerate() {
        // SAFETY: this test binary runs this one test, on one thread:
        // nothing reads the environment meanwhile.
        unsafe { std::env::set_var(k, if i % 2 == 0 { "" } else { "  " }) };
    }
    let c = pfs_client::Config::from_env().expect("empty variables are unset");
    let d = pfs_client::Config::new(&c.service_name);
    assert_eq!(c.shm_dir, d.shm_dir);
    assert_eq!(c.history_len, d.history_len);
    assert_eq!(c.max_threads, d.max_threads);
    assert_eq!(c.task_slots, d.task_slots);
    assert_eq!(c.reclaim_after, d.reclaim_after);
    assert!(
        c.instrument_rules.is_empty() && c.consumer_rules.is_empty() && c.actor_rules.is_empty()
    );
}
