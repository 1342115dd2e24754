//! Layer 2. Initialisation from C: `pfs_init` (the `PFS_*` environment),
//! `pfs_init_with` (a `pfs_config_t`), their error codes, the last
//! error's message, and the segment's path.

use std::ffi::c_char;
use std::sync::Mutex;
use std::time::Duration;

use pfs_client::{Config, InitError, parse_consumer_rules, parse_instrument_rules};

use crate::codes::*;
use crate::shield::shield;
use crate::text::{str_in, str_out};

/// `pfs_config_t.flags`: create the directory `0770` and the segment
/// `0660`, for an agent in the same group (`PFS_GROUP_ACCESS=1`).
pub const PFS_CONFIG_GROUP_ACCESS: u32 = 1;
/// `pfs_config_t.flags`: new instruments start disabled
/// (`PFS_INSTRUMENTS_ENABLED=no`).
pub const PFS_CONFIG_INSTRUMENTS_DISABLED: u32 = 2;
/// `pfs_config_t.flags`: new instruments start untimed
/// (`PFS_INSTRUMENTS_TIMED=no`).
pub const PFS_CONFIG_INSTRUMENTS_UNTIMED: u32 = 4;
/// `pfs_config_t.flags`: never reclaim empty thread-container pages (no
/// `pfs-maintenance` thread; `PFS_RECLAIM_AFTER=off`).
pub const PFS_CONFIG_NO_RECLAIM: u32 = 8;

/// Explicit settings for `pfs_init_with`. Zero-initialise it
/// (`pfs_config_t cfg = {0};`) and set what you need: a zero or NULL field
/// means the default. The strings are read during the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct pfs_config_t {
    /// Service name (NUL-terminated UTF-8); NULL: the executable's name.
    pub service_name: *const c_char,
    /// Segment directory; NULL: `/dev/shm/pfs`.
    pub shm_dir: *const c_char,
    /// Events per history ring; 0: 10.
    pub history_len: u32,
    /// Rows per `history_long` ring; 0: 10000.
    pub history_long_len: u32,
    /// Maximum concurrently instrumented threads; 0: 1024.
    pub max_threads: u32,
    /// Instrument class capacity; 0: 256.
    pub max_classes: u32,
    /// `PFS_CONFIG_*` bits.
    pub flags: u32,
    /// Quiet time in milliseconds before an empty thread-container page is
    /// reclaimed; 0: 30000 (see also `PFS_CONFIG_NO_RECLAIM`).
    pub reclaim_after_ms: u32,
    /// Initial instrument rules, as `PFS_INSTRUMENT`
    /// (`"wait/io/file/%=OFF;wait/synch/%=COUNTED"`); NULL: none.
    pub instrument_rules: *const c_char,
    /// Initial consumer rules, as `PFS_CONSUMERS`
    /// (`"events_waits_history_long=ON"`); NULL: none.
    pub consumer_rules: *const c_char,
}

/// The message of the last failed initialisation.
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

/// Records `msg` as the last error and returns `code`.
fn fail(code: i32, msg: String) -> i32 {
    *LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = msg;
    code
}

/// The code of an initialisation error.
fn code_of(e: &InitError) -> i32 {
    #[allow(unreachable_patterns)] // variants pfs-client may add later
    match e {
        InitError::AlreadyInitialized(_) => PFS_ERR_ALREADY_INITIALIZED,
        InitError::BadEnv(..) => PFS_ERR_BAD_ENV,
        InitError::WorldWritable(_) => PFS_ERR_WORLD_WRITABLE,
        InitError::InUse(_) => PFS_ERR_IN_USE,
        InitError::Io(..) => PFS_ERR_IO,
        InitError::Segment(..) => PFS_ERR_SEGMENT,
        InitError::Forked(_) => PFS_ERR_FORKED,
        _ => PFS_ERR_INTERNAL,
    }
}

/// Runs `pfs_client::init_with`, mapping its error.
fn start(config: Result<Config, InitError>) -> i32 {
    match config.and_then(pfs_client::init_with) {
        Ok(()) => PFS_OK,
        Err(e) => fail(code_of(&e), e.to_string()),
    }
}

/// The executable's file name, the default service name.
fn exe_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".into())
}

/// Builds a `Config` from a C config; `Err((code, message))` on a bad
/// string.
///
/// # Safety
///
/// Every non-null string pointer of `c` is a valid NUL-terminated string.
unsafe fn config_from(c: &pfs_config_t) -> Result<Config, (i32, String)> {
    let string = |p: *const c_char, what: &str| -> Result<Option<&str>, (i32, String)> {
        if p.is_null() {
            return Ok(None);
        }
        // SAFETY: non-null strings of `c` are valid (this function's
        // contract); they are only borrowed during the call.
        match unsafe { str_in(p) } {
            Some(s) => Ok(Some(s)),
            None => Err((PFS_ERR_INVALID_ARGUMENT, format!("{what} is not UTF-8"))),
        }
    };
    let service = string(c.service_name, "service_name")?;
    let mut cfg = Config::new(service.map_or_else(exe_name, str::to_owned));
    if let Some(d) = string(c.shm_dir, "shm_dir")? {
        cfg = cfg.shm_dir(d);
    }
    let or = |v: u32, d: u32| if v == 0 { d } else { v };
    cfg.history_len = or(c.history_len, cfg.history_len);
    cfg.history_long_len = or(c.history_long_len, cfg.history_long_len);
    cfg.max_threads = or(c.max_threads, cfg.max_threads);
    cfg.max_classes = or(c.max_classes, cfg.max_classes);
    cfg.group_access = c.flags & PFS_CONFIG_GROUP_ACCESS != 0;
    cfg.enabled = c.flags & PFS_CONFIG_INSTRUMENTS_DISABLED == 0;
    cfg.timed = c.flags & PFS_CONFIG_INSTRUMENTS_UNTIMED == 0;
    if c.flags & PFS_CONFIG_NO_RECLAIM != 0 {
        cfg.reclaim_after = None;
    } else if c.reclaim_after_ms != 0 {
        cfg.reclaim_after = Some(Duration::from_millis(c.reclaim_after_ms.into()));
    }
    let bad =
        |what: &str, e: &dyn std::fmt::Display| (PFS_ERR_INVALID_ARGUMENT, format!("{what}: {e}"));
    if let Some(r) = string(c.instrument_rules, "instrument_rules")? {
        cfg.instrument_rules =
            parse_instrument_rules(r).map_err(|e| bad("instrument_rules", &e))?;
    }
    if let Some(r) = string(c.consumer_rules, "consumer_rules")? {
        cfg.consumer_rules = parse_consumer_rules(r).map_err(|e| bad("consumer_rules", &e))?;
    }
    Ok(cfg)
}

/// Initialises instrumentation from the environment (`PFS_SHM_DIR`,
/// `PFS_SERVICE_NAME`, `PFS_HISTORY_SIZE`, ...: see the README): creates
/// this process's segment and holds a lock on it for the life of the
/// process. Returns `PFS_OK` or a negative `PFS_ERR_*` code (message:
/// `pfs_init_error`); on error the program runs on uninstrumented and
/// every other call is a no-op.
///
/// Threading: call once, from any thread, ideally before other threads
/// record events (events recorded before it are not counted).
#[unsafe(no_mangle)]
pub extern "C" fn pfs_init() -> i32 {
    shield(PFS_ERR_INTERNAL, || start(Config::from_env()))
}

/// Initialises instrumentation with explicit settings (see `pfs_config_t`;
/// the environment is not read). Returns as `pfs_init`; a NULL `config` is
/// `PFS_ERR_INVALID_ARGUMENT`.
///
/// Ownership: `config` and its strings are only read during the call.
///
/// # Safety
///
/// `config` is NULL or points to a `pfs_config_t` whose non-NULL string
/// fields are NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_init_with(config: *const pfs_config_t) -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        // SAFETY: `config` is null or a valid pfs_config_t (contract).
        let Some(c) = (unsafe { config.as_ref() }) else {
            return fail(PFS_ERR_INVALID_ARGUMENT, "config is NULL".into());
        };
        // SAFETY: its string fields are valid or null (contract).
        match unsafe { config_from(c) } {
            Ok(cfg) => start(Ok(cfg)),
            Err((code, msg)) => fail(code, msg),
        }
    })
}

/// Copies the message of the last failed `pfs_init`/`pfs_init_with` into
/// `buf` (`len` bytes, NUL-terminated, truncated to fit; "" if none) and
/// returns its full length, like `snprintf`: pass `buf` NULL to size it.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_init_error(buf: *mut c_char, len: usize) -> usize {
    shield(0, || {
        let msg = LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `buf` is null or valid for `len` bytes (contract).
        unsafe { str_out(&msg, buf, len) }
    })
}

/// Whether instrumentation is on: a `pfs_init*` call succeeded.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_is_initialized() -> bool {
    shield(false, || pfs_client::segment_path().is_some())
}

/// Copies the path of this process's segment file into `buf` (as
/// `pfs_init_error`) and returns its length; 0 if not initialised.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_segment_path(buf: *mut c_char, len: usize) -> usize {
    shield(0, || {
        let Some(p) = pfs_client::segment_path() else {
            return 0;
        };
        let p = p.to_string_lossy();
        // SAFETY: `buf` is null or valid for `len` bytes (contract).
        unsafe { str_out(&p, buf, len) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zero() -> pfs_config_t {
        pfs_config_t {
            service_name: std::ptr::null(),
            shm_dir: std::ptr::null(),
            history_len: 0,
            history_long_len: 0,
            max_threads: 0,
            max_classes: 0,
            flags: 0,
            reclaim_after_ms: 0,
            instrument_rules: std::ptr::null(),
            consumer_rules: std::ptr::null(),
        }
    }

    #[test]
    fn a_zero_config_is_the_defaults() {
        // SAFETY: all strings are null.
        let cfg = unsafe { config_from(&zero()) }.unwrap();
        assert_eq!(cfg, Config::new(exe_name()));
    }

    #[test]
    fn every_field_is_used() {
        let c = pfs_config_t {
            service_name: c"svc".as_ptr(),
            shm_dir: c"/tmp/x".as_ptr(),
            history_len: 3,
            history_long_len: 7,
            max_threads: 9,
            max_classes: 11,
            flags: PFS_CONFIG_GROUP_ACCESS
                | PFS_CONFIG_INSTRUMENTS_DISABLED
                | PFS_CONFIG_INSTRUMENTS_UNTIMED,
            reclaim_after_ms: 1500,
            instrument_rules: c"wait/io/file/%=OFF".as_ptr(),
            consumer_rules: c"events_waits_history_long=ON".as_ptr(),
        };
        // SAFETY: the strings are static C literals.
        let cfg = unsafe { config_from(&c) }.unwrap();
        assert_eq!(cfg.service_name, "svc");
        assert_eq!(cfg.shm_dir, std::path::Path::new("/tmp/x"));
        assert_eq!(
            (
                cfg.history_len,
                cfg.history_long_len,
                cfg.max_threads,
                cfg.max_classes
            ),
            (3, 7, 9, 11)
        );
        assert!(cfg.group_access && !cfg.enabled && !cfg.timed);
        assert_eq!(cfg.reclaim_after, Some(Duration::from_millis(1500)));
        assert_eq!(cfg.instrument_rules, vec![("wait/io/file/%".into(), 0)]);
        assert_eq!(
            cfg.consumer_rules,
            vec![("events_waits_history_long".into(), true)]
        );
        let c = pfs_config_t {
            flags: PFS_CONFIG_NO_RECLAIM,
            ..zero()
        };
        // SAFETY: all strings are null.
        assert_eq!(unsafe { config_from(&c) }.unwrap().reclaim_after, None);
    }

    #[test]
    fn bad_arguments_are_codes() {
        let c = pfs_config_t {
            service_name: c"a\xffb".as_ptr(),
            ..zero()
        };
        // SAFETY: static C literal.
        let r = unsafe { config_from(&c) };
        assert_eq!(r.unwrap_err().0, PFS_ERR_INVALID_ARGUMENT);
        let c = pfs_config_t {
            instrument_rules: c"no equals sign".as_ptr(),
            ..zero()
        };
        // SAFETY: static C literal.
        let r = unsafe { config_from(&c) };
        assert_eq!(r.unwrap_err().0, PFS_ERR_INVALID_ARGUMENT);
        // SAFETY: a null config is allowed.
        let r = unsafe { pfs_init_with(std::ptr::null()) };
        assert_eq!(r, PFS_ERR_INVALID_ARGUMENT);
        let mut buf = [0 as c_char; 64];
        // SAFETY: a local buffer of its own length.
        let n = unsafe { pfs_init_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, "config is NULL".len());
        assert!(!pfs_is_initialized());
        // SAFETY: null buffer allowed.
        assert_eq!(unsafe { pfs_segment_path(std::ptr::null_mut(), 0) }, 0);
    }
}
