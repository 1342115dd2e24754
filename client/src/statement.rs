//! Layer 6. Statements (`statement/<area>/<name>`): the unit of work a
//! thread serves (a request, a query, a job step), with its own figures.

use std::marker::PhantomData;

use pfs_shm_layout::layout::NONE_U32;
use pfs_shm_layout::writer::{KIND_STATEMENT, StatementFigures};

use crate::class::{ClassRef, Family, LazyRef};
use crate::event::{self, Active, end_open_stage};
use crate::thread;

/// A registered statement instrument.
#[derive(Clone, Copy, Debug)]
pub struct StatementClass(ClassRef);

impl StatementClass {
    /// Registers (or finds) `statement/<area>/<name>`.
    pub fn register(name: &str) -> Self {
        Self(ClassRef::register(name, Family::Statement))
    }

    /// PFS `ENABLED`.
    pub fn is_enabled(&self) -> bool {
        self.0.enabled()
    }

    /// Starts a statement on the current thread. Stages entered and waits
    /// recorded until the guard drops nest in it.
    #[inline]
    #[track_caller]
    pub fn start(&self) -> StatementGuard {
        let loc = std::panic::Location::caller();
        let active = event::begin::<KIND_STATEMENT>(
            thread::current,
            self.0,
            self.0.flags(),
            0,
            0,
            NONE_U32,
            Some(loc),
        );
        let parent = active.as_ref().map_or(0, |a| {
            let parent = a.ctx.statement_id.get();
            a.ctx.statement_id.set(a.data.event_id);
            parent
        });
        StatementGuard {
            active,
            parent,
            figures: StatementFigures::default(),
            _not_send: PhantomData,
        }
    }
}

/// A lazily registered statement class, for `static` instruments:
///
/// ```
/// use pfs_client::{LazyStageClass, LazyStatementClass};
/// static GET: LazyStatementClass = LazyStatementClass::new("statement/kv/get");
/// static LOOKUP: LazyStageClass = LazyStageClass::new("stage/kv/lookup");
///
/// let mut stmt = GET.start();
/// stmt.set_text("GET user:42");
/// LOOKUP.enter();
/// stmt.set_rows_sent(1);
/// drop(stmt); // ends the stage, then the statement
/// ```
#[derive(Debug)]
pub struct LazyStatementClass(LazyRef);

impl LazyStatementClass {
    /// Declares the statement; it registers on first use after `init`.
    pub const fn new(name: &'static str) -> Self {
        Self(LazyRef::new(name))
    }

    /// The registered class.
    #[inline(always)]
    pub fn get(&self) -> StatementClass {
        StatementClass(self.0.get(Family::Statement))
    }

    /// Shorthand for `get().start()`.
    #[inline]
    #[track_caller]
    pub fn start(&self) -> StatementGuard {
        self.get().start()
    }
}

/// A statement in progress; dropping it ends the open stage and the
/// statement. Not `Send`.
///
/// Keep it on the stack (or in what the stack owns), not in a
/// `thread_local!`: the thread's context is freed by a thread-local
/// destructor at thread exit, and a guard dropped by a thread-local
/// destructor that runs after that one would end its event through freed
/// memory.
#[must_use = "the statement ends when the guard is dropped"]
pub struct StatementGuard {
    active: Option<Active>,
    parent: u64,
    figures: StatementFigures,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for StatementGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatementGuard")
            .field("active", &self.active.is_some())
            .field("figures", &self.figures)
            .finish()
    }
}

/// 64-bit FNV-1a, the statement `DIGEST` of a digest text.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl StatementGuard {
    /// True if this statement is being recorded.
    pub fn is_recording(&self) -> bool {
        self.active.is_some()
    }

    /// `SQL_TEXT`: the statement's text (truncated to 200 bytes), copied
    /// now into `events_statements_current`.
    pub fn set_text(&mut self, text: &str) {
        if let Some(a) = &self.active {
            a.ctx.rec.set_statement_text(text);
        }
    }

    /// `DIGEST`: a hash of the normalised text the application supplies
    /// (e.g. `GET ?`), so that statements group by shape.
    pub fn set_digest_text(&mut self, digest_text: &str) {
        self.figures.digest = fnv1a(digest_text);
    }

    /// `ERRORS` (adds).
    pub fn add_errors(&mut self, n: u64) {
        self.figures.errors += n;
    }

    /// `WARNINGS` (adds).
    pub fn add_warnings(&mut self, n: u64) {
        self.figures.warnings += n;
    }

    /// `ROWS_AFFECTED`.
    pub fn set_rows_affected(&mut self, n: u64) {
        self.figures.rows_affected = n;
    }

    /// `ROWS_SENT`.
    pub fn set_rows_sent(&mut self, n: u64) {
        self.figures.rows_sent = n;
    }

    /// `ROWS_EXAMINED`.
    pub fn set_rows_examined(&mut self, n: u64) {
        self.figures.rows_examined = n;
    }

    /// Ends the statement now; returns its `TIMER_WAIT` in ps if timed.
    pub fn end(mut self) -> Option<u64> {
        let r = self.finish();
        self.active = None;
        r
    }

    /// Ends the open stage if it nests in this statement, then the
    /// statement itself, in place (no copy of the event).
    #[inline(never)]
    fn finish(&mut self) -> Option<u64> {
        let a = self.active.as_mut()?;
        if a.ctx.stage_id.get() != 0
            && a.ctx
                .stage
                .get()
                .is_some_and(|s| s.nesting_event_id == a.data.event_id)
        {
            end_open_stage(a.ctx);
        }
        a.ctx.statement_id.set(self.parent);
        event::end::<KIND_STATEMENT>(a, Some(&self.figures))
    }
}

impl Drop for StatementGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if self.active.is_some() {
            self.finish();
        }
    }
}
