//! `setup_actors` writes as MySQL's `INSERT`, `UPDATE` and `DELETE`: an
//! update changes the columns it gives and keeps the others, a new row
//! takes `YES` for a column not given, and a full table says so.

mod common;

use pfs_shm_layout::layout::MAX_ACTORS;
use pfs_shm_layout::setup::{self, ActorsFull};

fn row(seg: &pfs_shm_layout::Segment, user: &str) -> Option<(bool, bool)> {
    setup::read_actors(seg)
        .into_iter()
        .find(|a| a.user == user && a.host == "%" && a.role == "%")
        .map(|a| (a.enabled, a.history))
}

#[test]
fn an_update_keeps_the_columns_it_does_not_give() {
    let (_f, w) = common::create(&common::config("actors", 4, 2));
    let seg = w.segment();
    // A new row: columns not given are YES.
    assert_eq!(
        setup::set_actor(seg, "%", "app", "%", Some((Some(false), None))),
        Ok(1)
    );
    assert_eq!(row(seg, "app"), Some((false, true)));
    // Updating HISTORY keeps ENABLED = NO.
    assert_eq!(
        setup::set_actor(seg, "%", "app", "%", Some((None, Some(false)))),
        Ok(1)
    );
    assert_eq!(row(seg, "app"), Some((false, false)));
    assert_eq!(
        setup::set_actor(seg, "%", "app", "%", Some((Some(true), None))),
        Ok(1)
    );
    assert_eq!(row(seg, "app"), Some((true, false)));
    // Delete, then delete again: no row.
    assert_eq!(setup::set_actor(seg, "%", "app", "%", None), Ok(1));
    assert_eq!(row(seg, "app"), None);
    assert_eq!(setup::set_actor(seg, "%", "app", "%", None), Ok(0));
}

#[test]
fn a_full_table_refuses_a_new_row_and_still_updates_its_rows() {
    let (_f, w) = common::create(&common::config("actors", 4, 2));
    let seg = w.segment();
    let free = MAX_ACTORS - setup::read_actors(seg).len();
    for i in 0..free {
        let user = format!("u{i}");
        assert_eq!(
            setup::set_actor(seg, "%", &user, "%", Some((Some(true), Some(true)))),
            Ok(1)
        );
    }
    assert_eq!(
        setup::set_actor(seg, "%", "one-too-many", "%", Some((Some(true), None))),
        Err(ActorsFull)
    );
    assert!(ActorsFull.to_string().contains("delete a row"));
    // An existing row can still be updated, and a deletion makes room.
    assert_eq!(
        setup::set_actor(seg, "%", "u0", "%", Some((Some(false), None))),
        Ok(1)
    );
    assert_eq!(row(seg, "u0"), Some((false, true)));
    assert_eq!(setup::set_actor(seg, "%", "u0", "%", None), Ok(1));
    assert_eq!(
        setup::set_actor(seg, "%", "one-too-many", "%", Some((None, None))),
        Ok(1)
    );
}
