//! Whether a segment's process lives: the owner holds an exclusive `flock`
//! on its file for its whole life, so a shared lock can be taken only once
//! it is gone. Pids are never used: containers of a pod do not share a pid
//! namespace.

use std::fs::File;

use rustix::fs::FlockOperation;

/// True if nobody holds the segment's lock (its process has exited).
pub fn owner_is_dead(file: &File) -> bool {
    match rustix::fs::flock(file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = rustix::fs::flock(file, FlockOperation::Unlock);
            true
        }
        Err(_) => false,
    }
}
