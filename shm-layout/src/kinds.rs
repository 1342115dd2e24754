//! Instrument class kinds and wait operations, as stored in the segment.
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
    /// `idle`
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
    /// in the PFS taxonomy.
    pub fn from_name(name: &str) -> Option<Self> {
        let kind = if name.starts_with("wait/synch/mutex/") {
            Self::Mutex
        } else if name.starts_with("wait/synch/rwlock/") || name.starts_with("wait/synch/sxlock/") {
            Self::RwLock
        } else if name.starts_with("wait/synch/cond/") {
            Self::Cond
        } else if name.starts_with("wait/io/file/") {
            Self::File
        } else if name.starts_with("wait/io/socket/") {
            Self::Socket
        } else if name == "idle" {
            Self::Idle
        } else if name.starts_with("wait/") {
            Self::OtherWait
        } else if name.starts_with("stage/") {
            Self::Stage
        } else if name.starts_with("statement/") {
            Self::Statement
        } else if name.starts_with("memory/") {
            Self::Memory
        } else {
            return None;
        };
        Some(kind)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
