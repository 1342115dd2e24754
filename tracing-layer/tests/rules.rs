//! The rules and the span model without HTTP, on one thread: templates,
//! figures from span fields and from events (through stage spans), the
//! class chosen at the first enter, completion and cancellation, panics,
//! statement spans inside statement spans, spans exited out of order,
//! stages entered where their statement is not current, and spans no rule
//! matches. One test function: `init` is once per process.

mod common;

use std::collections::HashMap;

use pfs_client::LazyStatementClass;
use pfs_shm_layout::EventKind;
use pfs_shm_layout::reader::StatementEvent;
use pfs_tracing::{PfsLayer, SpanMatch, StageRule, StatementRule};
use tracing::field::Empty;
use tracing_subscriber::prelude::*;

static THREAD_STMT: LazyStatementClass = LazyStatementClass::new("statement/test/thread");
static AWAY: pfs_client::LazyWaitClass =
    pfs_client::LazyWaitClass::new("wait/synch/mutex/test/away");

/// The client's `DIGEST` of a digest text (64-bit FNV-1a).
fn digest(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn layer() -> PfsLayer {
    PfsLayer::builder()
        .statement(
            StatementRule::new(SpanMatch::name("job"), "jobs")
                .class("{kind}")
                .text("{kind} {id}")
                .digest("{kind}")
                .rows_sent("rows")
                .rows_affected("affected")
                .rows_examined("examined")
                .errors("errors")
                .warnings("warnings"),
        )
        .statement(
            StatementRule::new(SpanMatch::name("rpc"), "rpc")
                .class("{method}")
                .text("{method}")
                .status("code")
                .error_status(2),
        )
        .named_spans()
        .stage(StageRule::new(SpanMatch::name("step"), "jobs"))
        .build()
}

#[test]
fn rules_and_the_span_model() {
    let (_dir, path) = common::init("tracing-rules");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer())).unwrap();

    // 1. Figures from span fields and from events, also through a stage.
    let job = tracing::info_span!("job", kind = "resize", id = 7, rows = Empty, errors = Empty);
    job.in_scope(|| {
        tracing::info!(rows = 3u64, "sent some");
        tracing::info!(errors = true, "one error");
        let _step = tracing::info_span!("step").entered();
        tracing::info!(warnings = 2, examined = 10, affected = "4", "in the stage");
    });
    job.record("rows", 5); // last value wins
    drop(job);

    // 2. The class is chosen at the first enter; texts then, and again at
    // the close after a record.
    let late = tracing::info_span!("job", kind = Empty, id = 1);
    late.record("kind", "late");
    late.in_scope(|| {});
    late.record("kind", "later");
    drop(late);
    let nameless = tracing::info_span!("job", kind = Empty, id = 2);
    nameless.in_scope(|| {});
    drop(nameless);
    // A control character makes no instrument name: the unknown class too.
    let tabbed = tracing::info_span!("job", kind = "re\tsize", id = 4);
    tabbed.in_scope(|| {});
    drop(tabbed);
    // Never entered: nothing.
    drop(tracing::info_span!("job", kind = "never", id = 3));

    // 3. Completion: a status completes; past the threshold it is an
    // error; none is a cancellation; a panic is an error.
    for code in [Some(0), Some(5), None] {
        let rpc = tracing::info_span!("rpc", method = "Get", code = Empty);
        rpc.in_scope(|| {
            if let Some(c) = code {
                tracing::info!(code = c, "answered");
            }
        });
    }
    let panicked = std::panic::catch_unwind(|| {
        let _rpc = tracing::info_span!("rpc", method = "Panics", code = Empty).entered();
        panic!("handler panicked (expected by the test)");
    });
    assert!(panicked.is_err());

    // 4. A statement span inside a statement span: its own logical thread;
    // the outer one's stages resume after it.
    let outer = tracing::info_span!("statement/test/outer");
    outer.in_scope(|| {
        tracing::info_span!("stage/test/before").in_scope(|| {
            tracing::info_span!("statement/test/inner").in_scope(|| {
                let _s = tracing::info_span!("stage/test/in_inner").entered();
            });
        });
        let _s = tracing::info_span!("stage/test/after").entered();
    });
    drop(outer);

    // 5. Exits out of order: A entered, B entered, A exited first. Stages
    // entered then are B's; the thread's own state is intact after.
    let a = tracing::info_span!("statement/test/a");
    let b = tracing::info_span!("statement/test/b");
    let ga = a.enter();
    let gb = b.enter();
    drop(ga);
    tracing::info_span!("stage/test/in_b").in_scope(|| {});
    drop(gb);
    drop((a, b));
    let mut own = THREAD_STMT.start();
    own.set_text("on the thread");
    drop(own);

    // 6. A stage span entered where its statement is not current.
    let lonely = tracing::info_span!("statement/test/lonely");
    let elsewhere = lonely.in_scope(|| tracing::info_span!("stage/test/elsewhere"));
    elsewhere.in_scope(|| {});
    elsewhere.in_scope(|| {});
    lonely.in_scope(|| {});
    drop((elsewhere, lonely));
    // ... and entered again inside that enter: a wait after the inner
    // exit is still the statement's.
    let lonely2 = tracing::info_span!("statement/test/lonely2");
    let again = lonely2.in_scope(|| tracing::info_span!("stage/test/again"));
    again.in_scope(|| {
        again.in_scope(|| {});
        AWAY.get().start(pfs_client::Operation::Lock, 0).end();
    });
    drop((again, lonely2));

    // 7. Spans no rule matches.
    tracing::info_span!("plain", kind = "x").in_scope(|| tracing::info!(rows = 1, "ignored"));

    let s = common::read(&path);
    let sums = common::sums(&s);
    let name: HashMap<u32, &str> = s
        .classes
        .iter()
        .map(|c| (c.index, c.name.as_str()))
        .collect();
    let stmt = |class: &str| -> Vec<&StatementEvent> {
        s.long_statements
            .iter()
            .filter(|e| name[&e.ev.class] == class)
            .collect()
    };
    let stages_of = |st: &StatementEvent| -> Vec<&str> {
        s.long[EventKind::Stage.index()]
            .iter()
            .filter(|e| e.thread_id == st.ev.thread_id)
            .map(|e| {
                assert_eq!(e.nesting_event_id, Some(st.ev.event_id), "{e:?}");
                assert_eq!(e.nesting_event_type, Some(EventKind::Statement));
                assert!(e.timer_wait.unwrap() <= st.ev.timer_wait.unwrap());
                name[&e.class]
            })
            .collect()
    };

    // 1.
    let [resize] = stmt("statement/jobs/resize")[..] else {
        panic!("one resize job")
    };
    assert_eq!(resize.text, "resize 7");
    let f = &resize.figures;
    assert_eq!(
        (
            f.rows_sent,
            f.errors,
            f.warnings,
            f.rows_examined,
            f.rows_affected,
            f.cancelled
        ),
        (5, 1, 2, 10, 4, 0)
    );
    assert_eq!(f.digest, digest("resize"));
    assert_eq!(stages_of(resize), ["stage/jobs/step"]);

    // 2.
    let [late] = stmt("statement/jobs/late")[..] else {
        panic!("the class of the first enter")
    };
    assert_eq!(late.text, "later 1");
    assert_eq!(
        late.figures.digest,
        digest("later"),
        "rendered at the close"
    );
    assert_eq!(
        late.figures.cancelled, 0,
        "a rule without status never cancels"
    );
    let [unknown, tabbed] = stmt("statement/jobs/unknown")[..] else {
        panic!("no kind, and a kind with a tab: unknown")
    };
    assert_eq!(unknown.text, "? 2");
    assert_eq!(tabbed.text, "re\tsize 4");
    assert!(s.classes.iter().all(|c| !c.name.contains('\t')));
    assert_eq!(unknown.figures.digest, digest("?"));
    assert!(s.classes.iter().all(|c| c.name != "statement/jobs/later"));
    assert!(s.classes.iter().all(|c| c.name != "statement/jobs/never"));

    // 3.
    let rpc: Vec<_> = stmt("statement/rpc/Get")
        .iter()
        .map(|e| (e.figures.errors, e.figures.cancelled))
        .collect();
    assert_eq!(rpc, [(0, 0), (1, 0), (0, 1)]);
    assert_eq!(sums["statement/rpc/Get"].statement.cancelled, 1);
    let [p] = stmt("statement/rpc/Panics")[..] else {
        panic!("the panicking one")
    };
    assert_eq!((p.figures.errors, p.figures.cancelled), (1, 0));

    // 4.
    let [outer] = stmt("statement/test/outer")[..] else {
        panic!()
    };
    let [inner] = stmt("statement/test/inner")[..] else {
        panic!()
    };
    assert_ne!(outer.ev.thread_id, inner.ev.thread_id);
    assert_eq!(inner.ev.nesting_event_type, None);
    assert_eq!(stages_of(inner), ["stage/test/in_inner"]);
    assert_eq!(stages_of(outer), ["stage/test/before", "stage/test/after"]);

    // 5.
    let [a] = stmt("statement/test/a")[..] else {
        panic!()
    };
    let [b] = stmt("statement/test/b")[..] else {
        panic!()
    };
    assert!(stages_of(a).is_empty());
    assert_eq!(stages_of(b), ["stage/test/in_b"]);
    for st in [a, b, outer, inner, resize] {
        assert!(st.ev.timer_wait.unwrap() >= st.figures.cpu_time_ps);
        assert!(st.figures.cpu_time_ps > 0);
    }
    let [own] = stmt("statement/test/thread")[..] else {
        panic!()
    };
    assert!(
        s.threads.iter().any(|t| t.thread_id == own.ev.thread_id),
        "the thread's own statement has the thread's THREAD_ID"
    );
    assert_eq!(own.ev.nesting_event_type, None);
    assert_eq!(own.text, "on the thread");

    // 6.
    let [lonely] = stmt("statement/test/lonely")[..] else {
        panic!()
    };
    // Entered away from its statement, the stage took the statement's
    // context there: recorded in it (once, although entered twice).
    assert_eq!(stages_of(lonely), ["stage/test/elsewhere"]);
    let [lonely2] = stmt("statement/test/lonely2")[..] else {
        panic!()
    };
    let away = common::class_index(&s, AWAY.name()).unwrap();
    let [w] = s.long[EventKind::Wait.index()]
        .iter()
        .filter(|e| e.class == away)
        .collect::<Vec<_>>()[..]
    else {
        panic!("one wait")
    };
    assert_eq!(w.thread_id, lonely2.ev.thread_id, "{w:?}");
    assert_eq!(w.nesting_event_type, Some(EventKind::Stage), "{w:?}");

    // 7.
    assert!(s.classes.iter().all(|c| !c.name.contains("plain")));
    let statements: u64 = sums
        .iter()
        .filter(|(n, _)| n.starts_with("statement/"))
        .map(|(_, x)| x.count)
        .sum();
    assert_eq!(
        statements,
        1 + 3 + 4 + 2 + 2 + 1 + 1 + 1,
        "no statement beyond those"
    );
}
