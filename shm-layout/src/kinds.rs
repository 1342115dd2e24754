//! Instrument class kinds, event kinds and wait operations, as stored in
//! the segment.
//!
//! Layer 0 (see the crate docs): depends on no other module of the crate.

/// The kind of an instrument class, derived from its PFS name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ClassKind {
    /// `wait/synch/mutex/...`
    Mutex = 1,
    /// `wait/synch/rwlock/...`
    RwLock = 2,
    /// `wait/synch/cond/...`
    Cond = 3,
    /// `wait/io/file/...`
    File = 4,
    /// `wait/io/socket/...`
    Socket = 5,
    /// `idle`, or `idle/...` (ours: several idle instruments): a thread or
    /// task with nothing to do (a worker waiting for a job, a connection
    /// waiting for a request), as MySQL's `idle` instrument. Recorded in
    /// `events_waits_*` like any wait; analyses of where time goes leave
    /// it out.
    Idle = 6,
    /// Any other `wait/...` name.
    OtherWait = 7,
    /// `stage/...`
    Stage = 8,
    /// `statement/...`
    Statement = 9,
    /// `memory/...`
    Memory = 10,
}

impl ClassKind {
    /// The kind a PFS instrument name implies, or `None` if the name is not
    /// in the PFS taxonomy: its kind's prefix followed by at least one
    /// character (`wait/synch/mutex/` alone names nothing), and no control
    /// characters anywhere.
    pub fn from_name(name: &str) -> Option<Self> {
        const PREFIXES: [(&str, ClassKind); 10] = [
            ("wait/synch/mutex/", ClassKind::Mutex),
            ("wait/synch/rwlock/", ClassKind::RwLock),
            ("wait/synch/sxlock/", ClassKind::RwLock),
            ("wait/synch/cond/", ClassKind::Cond),
            ("wait/io/file/", ClassKind::File),
            ("wait/io/socket/", ClassKind::Socket),
            // Any other wait (`wait/io/table/...`, `wait/lock/...`).
            ("wait/", ClassKind::OtherWait),
            ("stage/", ClassKind::Stage),
            ("statement/", ClassKind::Statement),
            ("memory/", ClassKind::Memory),
        ];
        if name.chars().any(char::is_control) {
            return None;
        }
        if name == "idle"
            || name
                .strip_prefix("idle/")
                .is_some_and(|rest| !rest.is_empty())
        {
            return Some(Self::Idle);
        }
        // The first (most specific) prefix that matches decides; something
        // must follow it.
        let (prefix, kind) = PREFIXES.iter().find(|(p, _)| name.starts_with(p))?;
        (name.len() > prefix.len()).then_some(*kind)
    }

    /// From the stored value.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Mutex,
            2 => Self::RwLock,
            3 => Self::Cond,
            4 => Self::File,
            5 => Self::Socket,
            6 => Self::Idle,
            7 => Self::OtherWait,
            8 => Self::Stage,
            9 => Self::Statement,
            10 => Self::Memory,
            _ => return None,
        })
    }

    /// True for the wait kinds (`events_waits_*` tables).
    pub fn is_wait(self) -> bool {
        (self as u32) <= Self::OtherWait as u32
    }

    /// True for file and socket I/O (`wait/io/file/...`,
    /// `wait/io/socket/...`): the waits whose `NUMBER_OF_BYTES` counts the
    /// data they moved.
    ///
    /// ```
    /// use pfs_shm_layout::ClassKind;
    /// assert!(ClassKind::File.is_io() && ClassKind::Socket.is_io());
    /// assert!(!ClassKind::Mutex.is_io());
    /// ```
    pub fn is_io(self) -> bool {
        matches!(self, Self::File | Self::Socket)
    }

    /// Short lower-case name, as in the `setup_instruments` table.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::RwLock => "rwlock",
            Self::Cond => "cond",
            Self::File => "file",
            Self::Socket => "socket",
            Self::Idle => "idle",
            Self::OtherWait => "wait",
            Self::Stage => "stage",
            Self::Statement => "statement",
            Self::Memory => "memory",
        }
    }
}

/// A kind of timed event: what the tables, consumers, timers, history
/// rings and metrics are split by (waits, stages, statements), with
/// everything that differs between the kinds in one place.
///
/// The discriminants are the wire values of an event row's `event_type`
/// and `nesting_event_type`, where 0 means none: the wire encoding of a
/// nesting type is an `Option<EventKind>` ([`EventKind::from_wire`],
/// [`EventKind::wire`]). [`EventKind::index`] is the kind's index in the
/// segment's per-kind arrays (history rings, `history_long` sections,
/// consumer and timer bits).
///
/// ```
/// use pfs_shm_layout::{ClassKind, EventKind};
///
/// assert_eq!(EventKind::Wait.table_word(), "waits");
/// assert_eq!(EventKind::Stage.index(), 1);
/// assert_eq!(EventKind::from_index(2), Some(EventKind::Statement));
/// assert_eq!(EventKind::wire(Some(EventKind::Statement)), 3);
/// assert_eq!(EventKind::from_wire(0), None);
/// assert_eq!(EventKind::Wait.pfs_name(), "WAIT");
/// assert!(EventKind::Wait.matches(ClassKind::Mutex));
/// assert_eq!(EventKind::of_class(ClassKind::Stage), Some(EventKind::Stage));
/// assert_eq!(EventKind::of_class(ClassKind::Memory), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum EventKind {
    /// `wait/...` instruments (synch, I/O, ...): `events_waits_*`.
    Wait = 1,
    /// `stage/...` instruments: `events_stages_*`.
    Stage = 2,
    /// `statement/...` instruments: `events_statements_*`.
    Statement = 3,
}

impl EventKind {
    /// Every kind, in table (and index) order.
    pub const ALL: [EventKind; 3] = [EventKind::Wait, EventKind::Stage, EventKind::Statement];

    /// The index of this kind in the segment's per-kind arrays (waits 0,
    /// stages 1, statements 2), also its number in the agent's state
    /// files. A `const fn`, so that it can stand for the kind where only
    /// an integer can (a const generic parameter).
    #[inline(always)]
    pub const fn index(self) -> usize {
        self as usize - 1
    }

    /// The kind whose [`EventKind::index`] is `i`.
    #[inline(always)]
    pub const fn from_index(i: usize) -> Option<EventKind> {
        match i {
            0 => Some(EventKind::Wait),
            1 => Some(EventKind::Stage),
            2 => Some(EventKind::Statement),
            _ => None,
        }
    }

    /// Decodes a stored `event_type` / `nesting_event_type`: 0 (and any
    /// unknown value) is none.
    #[inline(always)]
    pub const fn from_wire(v: u32) -> Option<EventKind> {
        match v {
            1 => Some(EventKind::Wait),
            2 => Some(EventKind::Stage),
            3 => Some(EventKind::Statement),
            _ => None,
        }
    }

    /// Encodes an `event_type` / `nesting_event_type` for the segment:
    /// the kind's discriminant, 0 for none.
    #[inline(always)]
    pub const fn wire(kind: Option<EventKind>) -> u32 {
        match kind {
            Some(k) => k as u32,
            None => 0,
        }
    }

    /// The PFS spelling, as in `NESTING_EVENT_TYPE` (`WAIT`, `STAGE`,
    /// `STATEMENT`).
    pub const fn pfs_name(self) -> &'static str {
        match self {
            EventKind::Wait => "WAIT",
            EventKind::Stage => "STAGE",
            EventKind::Statement => "STATEMENT",
        }
    }

    /// The word in table and consumer names (`events_waits_current`).
    pub const fn table_word(self) -> &'static str {
        match self {
            EventKind::Wait => "waits",
            EventKind::Stage => "stages",
            EventKind::Statement => "statements",
        }
    }

    /// The kind's lower-case name (`wait`, `stage`, `statement`): the
    /// first word of its instruments' names and the `NAME` of its
    /// `setup_timers` row.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::Wait => "wait",
            EventKind::Stage => "stage",
            EventKind::Statement => "statement",
        }
    }

    /// Whether instruments of class kind `c` record events of this kind.
    pub fn matches(self, c: ClassKind) -> bool {
        match self {
            EventKind::Wait => c.is_wait(),
            EventKind::Stage => c == ClassKind::Stage,
            EventKind::Statement => c == ClassKind::Statement,
        }
    }

    /// The event kind an instrument of class kind `c` records, if any
    /// (memory instruments record none).
    pub fn of_class(c: ClassKind) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.matches(c))
    }
}

macro_rules! operations {
    ($($variant:ident = $n:literal => $s:literal,)*) => {
        /// A wait's `OPERATION`, with PFS spellings.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum Operation {
            $(#[doc = concat!("`", $s, "`")] $variant = $n,)*
        }

        impl Operation {
            /// From the stored value; unknown values are `None`.
            pub fn from_u32(v: u32) -> Option<Self> {
                match v {
                    $($n => Some(Self::$variant),)*
                    _ => None,
                }
            }

            /// The PFS `OPERATION` string.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $s,)*
                }
            }
        }
    };
}

operations! {
    Lock = 1 => "lock",
    TryLock = 2 => "try_lock",
    ReadLock = 3 => "read_lock",
    WriteLock = 4 => "write_lock",
    TryReadLock = 5 => "try_read_lock",
    TryWriteLock = 6 => "try_write_lock",
    Wait = 7 => "wait",
    TimedWait = 8 => "timed_wait",
    Create = 9 => "create",
    Open = 10 => "open",
    Close = 11 => "close",
    Read = 12 => "read",
    Write = 13 => "write",
    Seek = 14 => "seek",
    Sync = 15 => "sync",
    Stat = 16 => "stat",
    Delete = 17 => "delete",
    Rename = 18 => "rename",
    Chsize = 19 => "chsize",
    Connect = 20 => "connect",
    Accept = 21 => "accept",
    Send = 22 => "send",
    Recv = 23 => "recv",
    Idle = 24 => "idle",
    Other = 25 => "other",
}

/// How a file or socket instrument's waits are split by what they did, as
/// PFS's `file_summary_by_event_name` and `socket_summary_by_event_name`
/// split them: reads, writes, and everything else (open, close, sync,
/// seek, stat, connect, accept, ...). The discriminant is the mode's index
/// in a summary row's I/O words (`layout::IoTail`, a layer above).
///
/// ```
/// use pfs_shm_layout::{IoMode, Operation};
/// assert_eq!(IoMode::of_operation(Operation::Recv as u32), Some(IoMode::Read));
/// assert_eq!(IoMode::of_operation(Operation::Write as u32), Some(IoMode::Write));
/// assert_eq!(IoMode::of_operation(Operation::Sync as u32), Some(IoMode::Misc));
/// assert_eq!(IoMode::of_operation(Operation::Lock as u32), None); // not I/O
/// assert_eq!(IoMode::Misc.name(), "misc");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum IoMode {
    /// `read`, `recv`: the `*_READ` columns.
    Read = 0,
    /// `write`, `send`: the `*_WRITE` columns.
    Write = 1,
    /// Every other operation of a file or socket: the `*_MISC` columns.
    Misc = 2,
}

impl IoMode {
    /// Every mode, in index order.
    pub const ALL: [IoMode; 3] = [IoMode::Read, IoMode::Write, IoMode::Misc];

    /// Index of the mode's words in a summary row's I/O words.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The mode's lower-case name: the `mode` label of the metrics (as
    /// mysqld_exporter's file metrics have it), and the word of its PFS
    /// columns (`count_read`, `sum_timer_write`, `avg_timer_misc`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            IoMode::Read => "read",
            IoMode::Write => "write",
            IoMode::Misc => "misc",
        }
    }

    /// The mode of a wait whose operation is `op` (an [`Operation`] as
    /// stored): `None` for the operations of locks, condition variables
    /// and idle waits, and for values no operation has.
    #[inline(always)]
    pub const fn of_operation(op: u32) -> Option<IoMode> {
        // Locks' and conditions' operations come first: one compare for
        // them, on every wait's path.
        const _: () = assert!((Operation::TimedWait as u32) < Operation::Create as u32);
        if op < Operation::Create as u32 {
            return None;
        }
        Self::of_io_operation(op)
    }

    /// [`IoMode::of_operation`] past its first compare.
    #[inline(never)]
    const fn of_io_operation(op: u32) -> Option<IoMode> {
        const READ: u32 = Operation::Read as u32;
        const RECV: u32 = Operation::Recv as u32;
        const WRITE: u32 = Operation::Write as u32;
        const SEND: u32 = Operation::Send as u32;
        const FIRST_IO: u32 = Operation::Create as u32;
        const LAST_IO: u32 = Operation::Accept as u32;
        const OTHER: u32 = Operation::Other as u32;
        match op {
            READ | RECV => Some(IoMode::Read),
            WRITE | SEND => Some(IoMode::Write),
            FIRST_IO..=LAST_IO | OTHER => Some(IoMode::Misc),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_the_mode_of_its_name() {
        for v in 0..64 {
            let Some(op) = Operation::from_u32(v) else {
                assert_eq!(IoMode::of_operation(v), None, "value {v}");
                continue;
            };
            let want = match op.name() {
                "read" | "recv" => Some(IoMode::Read),
                "write" | "send" => Some(IoMode::Write),
                "lock" | "try_lock" | "read_lock" | "write_lock" | "try_read_lock"
                | "try_write_lock" | "wait" | "timed_wait" | "idle" => None,
                _ => Some(IoMode::Misc),
            };
            assert_eq!(IoMode::of_operation(v), want, "{}", op.name());
        }
        for m in IoMode::ALL {
            assert_eq!(IoMode::ALL[m.index()], m);
        }
    }

    #[test]
    fn kinds_from_names() {
        assert_eq!(
            ClassKind::from_name("wait/synch/mutex/kv/lock"),
            Some(ClassKind::Mutex)
        );
        assert_eq!(
            ClassKind::from_name("wait/io/file/kv/wal"),
            Some(ClassKind::File)
        );
        assert_eq!(
            ClassKind::from_name("stage/sql/parsing"),
            Some(ClassKind::Stage)
        );
        assert_eq!(ClassKind::from_name("mutex/kv"), None);
        assert_eq!(
            ClassKind::from_name("statement/http/GET /"),
            Some(ClassKind::Statement)
        );
        assert_eq!(
            ClassKind::from_name("wait/lock/table/sql/handler"),
            Some(ClassKind::OtherWait)
        );
        assert_eq!(
            ClassKind::from_name("wait/io/table/sql/handler"),
            Some(ClassKind::OtherWait)
        );
        assert_eq!(ClassKind::from_name("idle"), Some(ClassKind::Idle));
        assert_eq!(ClassKind::from_name("idle/kv/queue"), Some(ClassKind::Idle));
        assert_eq!(ClassKind::from_name("idle/"), None);
        assert_eq!(ClassKind::from_name("idler/x"), None);
        assert_eq!(ClassKind::from_name("idlex"), None);
        for nothing in [
            "wait/",
            "wait/synch/mutex/",
            "wait/io/file/",
            "stage/",
            "statement/",
            "memory/",
            "stage/a\nb",
            "wait/synch/mutex/a\u{7f}",
        ] {
            assert_eq!(ClassKind::from_name(nothing), None, "{nothing:?}");
        }
        for k in 1..=10 {
            let kind = ClassKind::from_u32(k).unwrap();
            assert_eq!(kind as u32, k);
        }
        assert!(ClassKind::Cond.is_wait() && !ClassKind::Stage.is_wait());
    }

    #[test]
    fn operations_round_trip() {
        for v in 1..=25 {
            assert_eq!(Operation::from_u32(v).unwrap() as u32, v);
        }
        assert_eq!(Operation::from_u32(0), None);
        assert_eq!(Operation::ReadLock.name(), "read_lock");
    }

    #[test]
    fn event_kinds_round_trip() {
        for (i, k) in EventKind::ALL.into_iter().enumerate() {
            assert_eq!(k.index(), i);
            assert_eq!(EventKind::from_index(k.index()), Some(k));
            assert_eq!(EventKind::from_wire(k as u32), Some(k));
            assert_eq!(EventKind::from_wire(EventKind::wire(Some(k))), Some(k));
        }
        assert_eq!(EventKind::from_index(3), None);
        assert_eq!(EventKind::wire(None), 0);
        assert_eq!(EventKind::from_wire(0), None);
        assert_eq!(EventKind::from_wire(4), None);
        let names: Vec<_> = EventKind::ALL.map(EventKind::pfs_name).into();
        assert_eq!(names, ["WAIT", "STAGE", "STATEMENT"]);
    }

    #[test]
    fn every_class_kind_has_at_most_one_event_kind() {
        for v in 1..=10 {
            let c = ClassKind::from_u32(v).unwrap();
            let kinds: Vec<_> = EventKind::ALL
                .into_iter()
                .filter(|k| k.matches(c))
                .collect();
            let expected = match c {
                ClassKind::Memory => None,
                ClassKind::Stage => Some(EventKind::Stage),
                ClassKind::Statement => Some(EventKind::Statement),
                _ => {
                    assert!(c.is_wait(), "{c:?}");
                    Some(EventKind::Wait)
                }
            };
            assert_eq!(kinds, Vec::from_iter(expected), "{c:?}");
            assert_eq!(EventKind::of_class(c), expected, "{c:?}");
        }
    }
}
