//! Layer 2. Initialisation from C: `pfs_init` (the `PFS_*` environment),
//! `pfs_init_with` (a `pfs_config_t`, each field checked up front), their
//! error codes, the last error's message, the refusal that a failed ABI
//! check leaves, and the segment's path.

use std::ffi::c_char;
use std::sync::Mutex;
use std::time::Duration;

use pfs_client::{Config, ConfigError, InitError, parse_consumer_rules, parse_instrument_rules};
use pfs_shm_layout::layout::SERVICE_NAME_BYTES;
use pfs_shm_layout::text::truncate_utf8;

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

/// Every `PFS_CONFIG_*` bit: `pfs_init_with` rejects any other.
const KNOWN_FLAGS: u32 = PFS_CONFIG_GROUP_ACCESS
    | PFS_CONFIG_INSTRUMENTS_DISABLED
    | PFS_CONFIG_INSTRUMENTS_UNTIMED
    | PFS_CONFIG_NO_RECLAIM;

/// Longest service name in bytes, as the segment stores it: a longer
/// `service_name` (or `PFS_SERVICE_NAME`) is cut to it on a character
/// boundary.
pub const PFS_SERVICE_NAME_MAX: usize = 64;

const _: () = assert!(
    PFS_SERVICE_NAME_MAX == SERVICE_NAME_BYTES,
    "PFS_SERVICE_NAME_MAX is the segment's service name field"
);

/// Explicit settings for `pfs_init_with`. Initialise it with
/// `PFS_CONFIG_INIT` (`pfs_config_t cfg = PFS_CONFIG_INIT;`, in C and C++;
/// in C `= {0}` is the same) and set what you need: a zero or NULL field
/// means the default. `pfs_init_with` checks every field first and
/// rejects one out of range with `PFS_ERR_INVALID_ARGUMENT` and a message
/// naming it (`pfs_init_error`). The strings are read during the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct pfs_config_t {
    /// Service name (NUL-terminated UTF-8); NULL or "": the executable's
    /// name. Cut to `PFS_SERVICE_NAME_MAX` (64) bytes on a character
    /// boundary.
    pub service_name: *const c_char,
    /// Segment directory; NULL or "": `/dev/shm/pfs`. A relative path is
    /// taken from the working directory at `pfs_init_with`.
    pub shm_dir: *const c_char,
    /// Events per history ring, 1 to 1024; 0: 10.
    pub history_len: u32,
    /// Rows per `history_long` ring, 1 to 16777216; 0: 10000.
    pub history_long_len: u32,
    /// Maximum concurrently instrumented threads, 1 to 1048576; 0: 1024.
    /// Rounded up to a multiple of 16 (the thread records of one
    /// container page): `max_threads = 40` gives 48 records. A thread
    /// beyond them records nothing (its events count as lost).
    pub max_threads: u32,
    /// Instrument class capacity, 1 to 1024; 0: 256.
    pub max_classes: u32,
    /// `PFS_CONFIG_*` bits; any other bit is `PFS_ERR_INVALID_ARGUMENT`.
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

/// The message of the last failed initialisation (or ABI check).
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

/// Why initialisation is refused, once an ABI check failed.
static REFUSED: Mutex<Option<String>> = Mutex::new(None);

/// Records `msg` as the last error and returns `code`.
pub(crate) fn fail(code: i32, msg: String) -> i32 {
    *LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = msg;
    code
}

/// Refuses every later initialisation, for `why` (a failed ABI check: the
/// program's structs are not this library's). Returns
/// `PFS_ERR_ABI_MISMATCH`, with `why` as the last error.
pub(crate) fn refuse(why: String) -> i32 {
    *REFUSED.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
    fail(PFS_ERR_ABI_MISMATCH, why)
}

/// The code of an initialisation error; `bad_config` for settings that
/// `Config::validate` refuses together (each in range, a segment too
/// large): `PFS_ERR_BAD_ENV` from the environment, else
/// `PFS_ERR_INVALID_ARGUMENT`.
fn code_of(e: &InitError, bad_config: i32) -> i32 {
    #[allow(unreachable_patterns)] // variants pfs-client may add later
    match e {
        InitError::BadConfig(_) => bad_config,
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

/// Runs `pfs_client::init_with` (unless an ABI check failed), mapping its
/// error.
fn start(config: Result<Config, InitError>, bad_config: i32) -> i32 {
    if pfs_client::is_forked_child() {
        // No lock may be waited for in a forked child (another thread of
        // the parent may have held it at the fork): pfs-client refuses
        // without one, and the message is kept only if its lock is free.
        let Err(e) = config.and_then(pfs_client::init_with) else {
            return PFS_OK;
        };
        if let Ok(mut last) = LAST_ERROR.try_lock() {
            *last = e.to_string();
        }
        return code_of(&e, bad_config);
    }
    // (A static link may have left the library's constructor out.)
    crate::warning::install();
    let refused = REFUSED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(why) = refused {
        return fail(PFS_ERR_ABI_MISMATCH, why);
    }
    match config.and_then(pfs_client::init_with) {
        Ok(()) => PFS_OK,
        Err(e) => fail(code_of(&e, bad_config), e.to_string()),
    }
}

/// `name` as a service name: cut to [`PFS_SERVICE_NAME_MAX`] bytes (the
/// segment keeps no more, and a longer file name may exceed what the
/// filesystem takes).
fn fit_service_name(mut cfg: Config) -> Config {
    let n = truncate_utf8(&cfg.service_name, PFS_SERVICE_NAME_MAX).len();
    cfg.service_name.truncate(n);
    cfg
}

/// The message of a field `Config::validate` rejected, in C's terms.
fn config_message(e: &ConfigError) -> String {
    match e {
        ConfigError::OutOfRange {
            field, value, max, ..
        } => format!("pfs_config_t.{field} is {value}; expected 1 to {max} (0: the default)"),
        e => format!("pfs_config_t.{e}"),
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
            None => Err((
                PFS_ERR_INVALID_ARGUMENT,
                format!("pfs_config_t.{what} is not UTF-8"),
            )),
        }
    };
    if c.flags & !KNOWN_FLAGS != 0 {
        return Err((
            PFS_ERR_INVALID_ARGUMENT,
            format!(
                "pfs_config_t.flags has unknown bits {:#x} (known: PFS_CONFIG_GROUP_ACCESS, PFS_CONFIG_INSTRUMENTS_DISABLED, PFS_CONFIG_INSTRUMENTS_UNTIMED, PFS_CONFIG_NO_RECLAIM)",
                c.flags & !KNOWN_FLAGS
            ),
        ));
    }
    let service = string(c.service_name, "service_name")?.filter(|s| !s.is_empty());
    let mut cfg = fit_service_name(Config::new(service.map_or_else(exe_name, str::to_owned)));
    if let Some(d) = string(c.shm_dir, "shm_dir")?.filter(|d| !d.is_empty()) {
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
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        (
            PFS_ERR_INVALID_ARGUMENT,
            format!("pfs_config_t.{what}: {e}"),
        )
    };
    if let Some(r) = string(c.instrument_rules, "instrument_rules")? {
        cfg.instrument_rules =
            parse_instrument_rules(r).map_err(|e| bad("instrument_rules", &e))?;
    }
    if let Some(r) = string(c.consumer_rules, "consumer_rules")? {
        cfg.consumer_rules = parse_consumer_rules(r).map_err(|e| bad("consumer_rules", &e))?;
    }
    // The numbers' ranges and the consumers' names, as `PFS_*` variables
    // are checked: nothing reaches the segment's layout unchecked.
    cfg.validate()
        .map_err(|e| (PFS_ERR_INVALID_ARGUMENT, config_message(&e)))?;
    Ok(cfg)
}

/// Initialises instrumentation from the environment (`PFS_SHM_DIR`,
/// `PFS_SERVICE_NAME`, `PFS_HISTORY_SIZE`, ...: see the README): creates
/// this process's segment and holds a lock on it for the life of the
/// process. A `PFS_SERVICE_NAME` longer than `PFS_SERVICE_NAME_MAX` bytes
/// is cut to it.
///
/// Returns `PFS_OK`, or (message: `pfs_init_error`)
/// `PFS_ERR_ALREADY_INITIALIZED`, `PFS_ERR_BAD_ENV`,
/// `PFS_ERR_WORLD_WRITABLE`, `PFS_ERR_IN_USE`, `PFS_ERR_IO`,
/// `PFS_ERR_SEGMENT`, `PFS_ERR_FORKED`, `PFS_ERR_ABI_MISMATCH` (after a
/// failed `pfs_check_abi`) or `PFS_ERR_INTERNAL`. On error the program
/// runs on uninstrumented and every other call is a no-op.
///
/// Threading: call once, from any thread, ideally before other threads
/// record events (events recorded before it are not counted). Takes
/// locks and allocates.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_init() -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        start(Config::from_env().map(fit_service_name), PFS_ERR_BAD_ENV)
    })
}

/// Initialises instrumentation with explicit settings (see `pfs_config_t`;
/// the environment is not read). Returns as `pfs_init` (but never
/// `PFS_ERR_BAD_ENV`), and `PFS_ERR_INVALID_ARGUMENT` for a NULL
/// `config` or a field it rejects (a string not UTF-8, a number out of
/// range, an unknown `flags` bit, a rule that does not parse or a
/// consumer rule that names no consumer), the message naming the field.
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
            Ok(cfg) => start(Ok(cfg), PFS_ERR_INVALID_ARGUMENT),
            Err((code, msg)) => fail(code, msg),
        }
    })
}

/// Copies the message of the last failed `pfs_init`, `pfs_init_with` or
/// `pfs_check_abi` into `buf` (`len` bytes, NUL-terminated, truncated to
/// fit; "" if none) and returns its full length, like `snprintf`: pass
/// `buf` NULL to size it.
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
/// `pfs_init_error`) and returns its length; if not initialised, writes
/// "" and returns 0.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_segment_path(buf: *mut c_char, len: usize) -> usize {
    shield(0, || {
        let Some(p) = pfs_client::segment_path() else {
            // SAFETY: as below; "" written, as `pfs_init_error` writes it.
            unsafe { str_out("", buf, len) };
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

    /// The error of `c`, which `config_from` must reject.
    fn rejected(c: &pfs_config_t) -> (i32, String) {
        // SAFETY: the tests' strings are static C literals or null.
        unsafe { config_from(c) }.expect_err("rejected")
    }

    #[test]
    fn what_pfs_consumers_rejects_pfs_config_t_rejects() {
        let c = pfs_config_t {
            consumer_rules: c"events_waits_histroy=ON".as_ptr(),
            ..zero()
        };
        let (code, msg) = rejected(&c);
        assert_eq!(code, PFS_ERR_INVALID_ARGUMENT);
        assert!(
            msg.starts_with("pfs_config_t.consumer_rules: ") && msg.contains("histroy"),
            "{msg}"
        );
    }

    #[test]
    fn unknown_flags_are_rejected() {
        let c = pfs_config_t {
            flags: PFS_CONFIG_NO_RECLAIM | 0x30,
            ..zero()
        };
        let (code, msg) = rejected(&c);
        assert_eq!(code, PFS_ERR_INVALID_ARGUMENT);
        assert!(
            msg.contains("pfs_config_t.flags has unknown bits 0x30"),
            "{msg}"
        );
    }

    #[test]
    fn numbers_out_of_range_name_the_c_field() {
        let cases = [
            (
                pfs_config_t {
                    max_threads: u32::MAX,
                    ..zero()
                },
                "pfs_config_t.max_threads is 4294967295; expected 1 to 1048576 (0: the default)",
            ),
            (
                pfs_config_t {
                    history_len: 1025,
                    ..zero()
                },
                "pfs_config_t.history_len is 1025; expected 1 to 1024 (0: the default)",
            ),
            (
                pfs_config_t {
                    max_classes: 1025,
                    ..zero()
                },
                "pfs_config_t.max_classes is 1025; expected 1 to 1024 (0: the default)",
            ),
            (
                pfs_config_t {
                    history_long_len: (1 << 24) + 1,
                    ..zero()
                },
                "pfs_config_t.history_long_len is 16777217; expected 1 to 16777216 (0: the default)",
            ),
        ];
        for (c, want) in cases {
            assert_eq!(rejected(&c), (PFS_ERR_INVALID_ARGUMENT, want.to_string()));
        }
        // The limits pfs.h states are the client's.
        let cfg = Config::new("x");
        assert_eq!(*Config::HISTORY_LEN_RANGE.end(), 1024);
        assert_eq!(*Config::MAX_CLASSES_RANGE.end(), 1024);
        assert_eq!(*Config::HISTORY_LONG_LEN_RANGE.end(), 1 << 24);
        assert_eq!(*cfg.max_threads_range().end(), 1 << 20);
        assert_eq!(cfg.records_per_page, 16, "max_threads rounds up to 16s");
        assert_eq!(
            (
                cfg.history_len,
                cfg.history_long_len,
                cfg.max_threads,
                cfg.max_classes
            ),
            (10, 10_000, 1024, 256),
            "the defaults pfs.h states"
        );
    }

    #[test]
    fn long_service_names_are_cut_and_empty_names_and_dirs_default() {
        let long = std::ffi::CString::new("é".repeat(200)).unwrap();
        let c = pfs_config_t {
            service_name: long.as_ptr(),
            ..zero()
        };
        // SAFETY: a live CString.
        let cfg = unsafe { config_from(&c) }.unwrap();
        assert_eq!(cfg.service_name, "é".repeat(PFS_SERVICE_NAME_MAX / 2));
        let c = pfs_config_t {
            service_name: c"".as_ptr(),
            ..zero()
        };
        // SAFETY: a static literal.
        let cfg = unsafe { config_from(&c) }.unwrap();
        assert_eq!(cfg.service_name, exe_name());
        let c = pfs_config_t {
            shm_dir: c"".as_ptr(),
            ..zero()
        };
        // SAFETY: a static literal.
        let cfg = unsafe { config_from(&c) }.unwrap();
        assert_eq!(
            cfg.shm_dir,
            pfs_client::Config::new("x").shm_dir,
            "empty: the default"
        );
    }
}
