//! `pfs-agent`: the command line over the `pfs_agent` library, and its
//! logs (stderr: plain text, coloured only on a terminal, or JSON lines
//! with `PFS_LOG_FORMAT=json`). The binary's own modules are the top
//! layers of the agent: [`cli`] (layer 8, the flags) and [`commands`]
//! (layer 9, one file per command); see the layer table in the library's
//! documentation.

use std::io::IsTerminal;

use anyhow::bail;

mod cli;
mod commands;

use cli::{Cli, Command};

/// How log lines are written (`PFS_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// One line of text per event (the default); coloured only on a
    /// terminal, and never with `NO_COLOR` set.
    Text,
    /// One JSON object per line, for log shippers: `timestamp`, `level`,
    /// `target`, `message` and the event's fields at the top level.
    Json,
}

impl LogFormat {
    /// The format `PFS_LOG_FORMAT` asks for: `text` (or unset) or `json`,
    /// in any case. Anything else is text, with the error to log: as for
    /// `PFS_LOG`, a typo must not stop the agent.
    fn from_env() -> (Self, Option<anyhow::Error>) {
        let v = match std::env::var("PFS_LOG_FORMAT") {
            Err(std::env::VarError::NotPresent) => return (Self::Text, None),
            Ok(v) => v,
            Err(std::env::VarError::NotUnicode(v)) => v.to_string_lossy().into_owned(),
        };
        match v.trim() {
            t if t.is_empty() || t.eq_ignore_ascii_case("text") => (Self::Text, None),
            t if t.eq_ignore_ascii_case("json") => (Self::Json, None),
            _ => (
                Self::Text,
                Some(anyhow::anyhow!(
                    "PFS_LOG_FORMAT={v:?} is not a log format: use text or json; logging as text instead"
                )),
            ),
        }
    }
}

/// Colours (ANSI escapes) only when stderr is a terminal and `NO_COLOR`
/// (<https://no-color.org>) is unset or empty: a log written to a file, a
/// pipe or `kubectl logs` stays plain text.
fn log_colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The levels `PFS_LOG` may be alone (any case).
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// The log filter `PFS_LOG` asks for (`value`; unset or empty:
/// `default_level`): a level, or `EnvFilter` directives
/// (`pfs_agent=debug,hyper=warn`). A bare word that is not a level is an
/// error, and so is a directive `EnvFilter` cannot read: `EnvFilter` takes
/// a bare word for a target's name, so `warning` would silently turn off
/// every log, errors included (a target alone is written
/// `pfs_agent=trace`).
fn log_filter(
    value: Option<&str>,
    default_level: &str,
) -> anyhow::Result<tracing_subscriber::EnvFilter> {
    let hint = "use trace, debug, info, warn, error or off, or EnvFilter directives such as pfs_agent=debug";
    let v = match value.map(str::trim) {
        None | Some("") => return Ok(default_level.into()),
        Some(v) => v,
    };
    if !v.contains(['=', ',']) && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(v)) {
        bail!("PFS_LOG={v} is not a level: {hint}");
    }
    tracing_subscriber::EnvFilter::try_new(v)
        .map_err(|e| anyhow::anyhow!("PFS_LOG={v} is not a log filter ({e}): {hint}"))
}

/// Logs to stderr in the format `PFS_LOG_FORMAT` asks for, at `PFS_LOG`
/// (see [`log_filter`]) or `default_level`. A `PFS_LOG` that is not a
/// filter, or a `PFS_LOG_FORMAT` that is not a format, is logged as an
/// error and the default used: a typo must neither silence the logs nor
/// stop the agent (a sidecar that cannot start can keep its application
/// from starting).
fn init_logs(default_level: &str) -> anyhow::Result<()> {
    let (format, bad_format) = LogFormat::from_env();
    let filter = match std::env::var("PFS_LOG") {
        Ok(v) => log_filter(Some(&v), default_level),
        Err(std::env::VarError::NotPresent) => log_filter(None, default_level),
        Err(std::env::VarError::NotUnicode(v)) => Err(anyhow::anyhow!(
            "PFS_LOG={v:?} is not a log filter (not UTF-8)"
        )),
    };
    let (filter, bad) = match filter {
        Ok(f) => (f, None),
        Err(e) => (default_level.into(), Some(e)),
    };
    // A log line that cannot be written (stderr a closed pipe) is dropped:
    // tracing-subscriber would otherwise report it with `eprintln!`, which
    // panics on that same stderr, in whatever thread logged (the signal
    // handler's, say, which then never stops the process).
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => logs.with_ansi(log_colours()).init(),
        LogFormat::Json => logs.with_ansi(false).json().flatten_event(true).init(),
    }
    if let Some(e) = bad_format {
        tracing::error!("{e:#}");
    }
    if let Some(e) = bad {
        tracing::error!("{e:#}; logging at {default_level} instead");
    }
    Ok(())
}

/// Runs the command; an error is printed as `Error:` and its causes, one
/// per line (never a backtrace, whatever `RUST_BACKTRACE` says: these are
/// the user's errors, each worded to say what to do), with exit code 1. A
/// cause whose text the line above already ends with (libraries' errors
/// quote their source, for programs that print only the top one) is not
/// printed again.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut above = e.to_string();
            eprintln!("Error: {above}");
            for cause in e.chain().skip(1) {
                let text = cause.to_string();
                if !above.ends_with(&text) {
                    eprintln!("  caused by: {text}");
                }
                above = text;
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse_args();
    // One-shot commands only warn; long-running ones also log progress.
    let default_level = match cli.command {
        Command::Query(_) | Command::Setup(_) => "warn",
        _ => "info",
    };
    init_logs(default_level)?;
    match cli.command {
        Command::Serve(a) => commands::serve::run(a),
        Command::Query(a) => commands::query::run(a),
        Command::Setup(c) => commands::setup::run(c),
        #[cfg(feature = "demo")]
        Command::Demo(a) => commands::demo::run(a),
        #[cfg(feature = "demo")]
        Command::Workload(a) => commands::demo::workload(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::filter::LevelFilter;

    /// A bare word is a level (any case) or an error: `EnvFilter` would
    /// read it as a target and silence every log. Directives still work.
    #[test]
    fn pfs_log_is_a_level_or_directives() {
        for bad in ["warning", "verbose", "loud"] {
            let e = log_filter(Some(bad), "info").unwrap_err().to_string();
            assert!(
                e.contains(&format!("PFS_LOG={bad} is not a level")) && e.contains("warn, error"),
                "{e}"
            );
        }
        for (v, want) in [
            ("warn", LevelFilter::WARN),
            ("WARN", LevelFilter::WARN),
            (" Debug ", LevelFilter::DEBUG),
            ("off", LevelFilter::OFF),
            ("", LevelFilter::INFO),
            ("pfs_agent=debug", LevelFilter::DEBUG),
            ("info,hyper=off", LevelFilter::INFO),
        ] {
            let f = log_filter(Some(v), "info").unwrap_or_else(|e| panic!("{v:?}: {e}"));
            assert_eq!(f.max_level_hint(), Some(want), "{v:?}");
        }
        assert_eq!(
            log_filter(None, "warn").unwrap().max_level_hint(),
            Some(LevelFilter::WARN)
        );
        assert!(log_filter(Some("pfs_agent=loud"), "info").is_err());
    }
}
