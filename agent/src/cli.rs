//! Layer 8 (binary): the command-line interface, every command's flags.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use pfs_agent::export::otlp::OtlpArgs;
use pfs_agent::segments::{DEFAULT_MAX_SEGMENT_SIZE, OwnerPolicy, Policy};
use pfs_agent::server::rebinding::{Scope, parse_allowed_host};
use pfs_agent::server::{HostCheck, Limits};
use pfs_agent::util::text::{ByteSize, HumanDuration, parse_duration};

/// pfs-agent: exports pfs-exporter segments as Prometheus metrics and
/// Performance-Schema tables.
#[derive(Debug, Parser)]
#[command(name = "pfs-agent", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses this process's arguments as [`Parser::parse`] does (exiting
    /// with clap's message on an error, `--help` or `--version`), except
    /// that a [`SHM_DIR_ENV`] set but empty counts as unset: see
    /// [`empty_shm_dir_is_unset`].
    pub fn parse_args() -> Self {
        let mut cmd = Cli::command();
        // Blank, as the instrumented processes read it (they trim it).
        if std::env::var_os(SHM_DIR_ENV)
            .is_some_and(|v| v.to_str().is_some_and(|v| v.trim().is_empty()))
        {
            cmd = empty_shm_dir_is_unset(cmd);
        }
        let matches = cmd.get_matches_mut();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
    }
}

/// The variable that names the segment directory, for the agent as for
/// the instrumented processes.
pub const SHM_DIR_ENV: &str = "PFS_SHM_DIR";

/// `cmd` for a [`SHM_DIR_ENV`] that is set but empty or blank (`PFS_SHM_DIR=` in
/// a shell or a manifest), which clap takes as a value given: it reports
/// `--shm-dir` as missing its value, a flag the user never typed (and
/// clap 4 has no setting to ignore empty variables). Instead, a flag with
/// a default stops reading the variable, so that the default applies as
/// for an unset one (its `--help` then shows no `[env: ...]`); a flag
/// without one (a `PathBuf`, like every flag that reads the variable)
/// says that the variable is empty and what to set.
fn empty_shm_dir_is_unset(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        if a.get_env() != Some(std::ffi::OsStr::new(SHM_DIR_ENV)) {
            a
        } else if a.get_default_values().is_empty() {
            a.value_parser(OsStringValueParser::new().try_map(|dir| {
                if dir.to_str().is_some_and(|d| d.trim().is_empty()) {
                    Err(format!(
                        "{SHM_DIR_ENV} is set but empty; set it to the segment directory, or pass --shm-dir DIR"
                    ))
                } else {
                    Ok(PathBuf::from(dir))
                }
            }))
        } else {
            a.env(None)
        }
    })
    .mut_subcommands(empty_shm_dir_is_unset)
}

/// The `Host` check of loopback requests (`serve`, `demo`).
#[derive(Debug, Args, Clone)]
pub struct HostArgs {
    /// A host name that a request arriving on a loopback address may give
    /// in its Host header, besides IP addresses, localhost, this machine's
    /// name and the names of /etc/hosts (repeat the flag; comma-separated
    /// in the variable; '*' accepts any). Other names get 403: a web page
    /// cannot read the agent through a name it rebinds to a loopback
    /// address. Requests on other addresses are checked only with
    /// --host-check all.
    #[arg(
        long = "allowed-host",
        env = "PFS_ALLOWED_HOSTS",
        value_name = "NAME",
        value_delimiter = ',',
        value_parser = parse_allowed_host
    )]
    pub allowed_hosts: Vec<String>,
    /// Which connections' Host headers are checked: loopback (those that
    /// arrive on 127.0.0.1 or ::1) or all (also a name a page rebinds to
    /// the machine's LAN address, and a port forwarded to the agent, as
    /// `docker run -p` publishes it: then a scraper that names the agent
    /// by a DNS name needs it in --allowed-host; addresses always pass).
    #[arg(long, env = "PFS_HOST_CHECK", value_enum, default_value_t = Scope::Loopback)]
    pub host_check: Scope,
}

impl HostArgs {
    /// The check these flags make.
    pub fn check(&self) -> HostCheck {
        HostCheck::new(&self.allowed_hosts, self.host_check)
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve /metrics, /healthz and /api/v1/tables for every segment in a directory.
    Serve(ServeArgs),
    /// Print one PFS table read directly from the segments.
    #[command(after_help = query_tables())]
    Query(QueryArgs),
    /// Run the agent with a real instrumented workload process (one-command demo).
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
    /// Change live setup directly in the segments (local admin, by file permission).
    #[command(subcommand)]
    Setup(SetupCommand),
    /// The demo's workload process (started by `demo`).
    #[cfg(feature = "demo")]
    #[command(hide = true)]
    Workload(WorkloadArgs),
}

/// Where segments are.
#[derive(Debug, Args, Clone)]
pub struct DirArgs {
    /// Directory of segment files (the instrumented processes' PFS_SHM_DIR).
    #[arg(long, env = SHM_DIR_ENV, default_value = pfs_shm_layout::files::DEFAULT_SHM_DIR)]
    pub shm_dir: PathBuf,
}

/// The agent's port: the OpenTelemetry Prometheus exporter's default.
pub const DEFAULT_PORT: u16 = 9464;

/// `serve` listens on every interface by default (a sidecar).
const SERVE_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), DEFAULT_PORT);

/// `demo` listens on this host only by default.
#[cfg(feature = "demo")]
const DEMO_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT);

/// Worker threads of the demo workload by default.
#[cfg(feature = "demo")]
const DEFAULT_WORKERS: usize = 4;

/// `serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    /// Segment directory.
    pub dir: DirArgs,
    /// Address to listen on. The default listens on every interface, IPv6
    /// and IPv4 (dual-stack; on a host without IPv6, IPv4 only, as
    /// 0.0.0.0:9464), as a sidecar must for Prometheus and the kubelet to
    /// reach it on any cluster; use 127.0.0.1:9464 to keep it local.
    #[arg(long, env = "PFS_LISTEN", default_value_t = SERVE_LISTEN, value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// How long a dead process's final counters keep being exported before
    /// they fold into the service totals and its file is removed (e.g. 300s, 5m).
    #[arg(long, env = "PFS_DEAD_RETENTION", default_value = "5m", value_parser = parse_duration, allow_hyphen_values = true)]
    pub dead_retention: Duration,
    /// How long a service whose processes are all gone (retired) stays in
    /// /metrics and OTLP, counting from its last process's retirement:
    /// then its series are dropped (and its totals forgotten), so that an
    /// agent over a directory shared by many short-lived programs does not
    /// export every service it ever saw. A process of it that comes back
    /// later starts its counters from zero (a reset, which rate() handles).
    /// `never` keeps them for ever (e.g. 24h, 30m, never).
    #[arg(long, env = "PFS_FORGET_RETIRED_AFTER", default_value = "24h", value_parser = parse_forget_after, allow_hyphen_values = true)]
    pub forget_retired_after: ForgetAfter,
    /// After SIGTERM or SIGINT, keep serving /metrics (with fresh
    /// snapshots) and /healthz this long before stopping, so the next
    /// scrape still sees the final counters of an application that stopped
    /// just before (e.g. 20s: at least one scrape interval). A second
    /// signal stops at once; 0s stops at the first.
    #[arg(long, env = "PFS_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub shutdown_delay: Duration,
    /// File holding the bearer token that control requests must present.
    /// If the file does not exist, the agent starts with control disabled
    /// (an optional Kubernetes Secret not created yet); any other problem
    /// with it stops the agent.
    #[arg(long, env = "PFS_CONTROL_TOKEN_FILE")]
    pub control_token_file: Option<PathBuf>,
    /// File holding a bearer token that reads (/metrics, /api/v1/tables)
    /// must present; the control token is accepted too. /healthz stays
    /// open. Without it, reads are open to anyone who can connect; a file
    /// that does not exist stops the agent (reads never open by accident).
    #[arg(long, env = "PFS_READ_TOKEN_FILE")]
    pub read_token_file: Option<PathBuf>,
    #[command(flatten)]
    /// The Host check of loopback requests.
    pub hosts: HostArgs,
    #[command(flatten)]
    /// Connection limits.
    pub limits: LimitArgs,
    #[command(flatten)]
    /// Setup defaults applied to every segment found.
    pub defaults: DefaultsArgs,
    #[command(flatten)]
    /// Which segment files are accepted.
    pub policy: PolicyArgs,
    #[command(flatten)]
    /// OTLP metrics push.
    pub otlp: OtlpArgs,
}

/// Limits that protect the agent from scrape storms and slow clients.
#[derive(Debug, Args, Clone)]
pub struct LimitArgs {
    /// Connections served at once (16 more answer only /healthz at once);
    /// with all taken, the one idle the longest (250 ms or more) is closed
    /// for a new one, else it waits in the listen backlog.
    #[arg(long, env = "PFS_MAX_CONNECTIONS", default_value_t = Limits::DEFAULT.max_connections as u32, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: u32,
    /// Time a client has to send its request headers; also ends idle
    /// keep-alive connections (e.g. 10s, 500ms).
    #[arg(long, env = "PFS_HEADER_TIMEOUT", default_value_t = HumanDuration(Limits::DEFAULT.header_timeout), value_parser = parse_timeout, allow_hyphen_values = true)]
    pub header_timeout: HumanDuration,
    /// Longest life of one connection, whatever it does (e.g. 60s).
    #[arg(long, env = "PFS_CONNECTION_TIMEOUT", default_value_t = HumanDuration(Limits::DEFAULT.connection_timeout), value_parser = parse_timeout, allow_hyphen_values = true)]
    pub connection_timeout: HumanDuration,
}

impl LimitArgs {
    /// As the server's limits.
    pub fn limits(&self) -> Limits {
        Limits {
            max_connections: self.max_connections as usize,
            header_timeout: self.header_timeout.0,
            connection_timeout: self.connection_timeout.0,
        }
    }
}

/// Which files of the segment directory are accepted (`serve`, `query`).
/// World-writable files are always refused.
#[derive(Debug, Args, Clone)]
pub struct PolicyArgs {
    /// Owner a segment file must have: `any`, `uid` (the agent's effective
    /// uid) or `group` (one of the agent's groups). Others are refused
    /// with reason `foreign_owner`.
    #[arg(long, value_enum, env = "PFS_REQUIRE_OWNER", default_value = "any")]
    pub require_owner: OwnerPolicy,
    /// Largest segment file accepted (bytes, or with a K, M, G or T
    /// suffix); larger files are refused with reason `too_large`.
    #[arg(long, env = "PFS_MAX_SEGMENT_SIZE", default_value_t = ByteSize(DEFAULT_MAX_SEGMENT_SIZE), value_parser = parse_max_size)]
    pub max_segment_size: ByteSize,
}

impl PolicyArgs {
    /// As a discovery policy.
    pub fn policy(&self) -> Policy {
        Policy {
            owner: self.require_owner,
            max_size: self.max_segment_size.0,
        }
    }
}

/// Setup defaults the agent applies to every segment it finds (and to
/// instruments registered later), like mysqld's
/// `--performance-schema-instrument`: once per process (recorded in its
/// segment), so that an agent restarted with the same defaults keeps the
/// live changes made since.
#[derive(Debug, Args, Clone, Default)]
pub struct DefaultsArgs {
    /// `PATTERN=ON|OFF|COUNTED` (repeatable), e.g. `--instrument 'wait/io/file/%=OFF'`.
    /// The longest matching pattern wins.
    #[arg(long = "instrument", value_name = "PATTERN=VALUE")]
    pub instruments: Vec<String>,
    /// `PATTERN=ON|OFF` (repeatable), e.g. `--consumer 'events_waits_history_long=ON'`.
    #[arg(long = "consumer", value_name = "PATTERN=VALUE")]
    pub consumers: Vec<String>,
    /// A `setup_actors` row, `USER@HOST[/ROLE]=ON|OFF|NO_HISTORY`
    /// (repeatable; user, host and role each a name or `%`, as in MySQL's
    /// table; `%@%=...` sets the default row), e.g. `--actor 'batch@%=OFF'`.
    /// It decides for the threads that declare their actor once the agent
    /// has found the process (the application's `PFS_ACTORS` holds from
    /// its start).
    #[arg(long = "actor", value_name = "USER@HOST[/ROLE]=VALUE")]
    pub actors: Vec<String>,
}

/// Which processes a setup change applies to.
#[derive(Debug, Args, Clone)]
pub struct TargetArgs {
    #[command(flatten)]
    /// Segment directory.
    pub dir: DirArgs,
    /// Only this service.
    #[arg(long)]
    pub service: Option<String>,
    /// Only this pid.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Option<u32>,
}

/// `yes`/`no`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum YesNo {
    /// Yes.
    Yes,
    /// No.
    No,
}

impl YesNo {
    /// As a bool.
    pub fn get(self) -> bool {
        self == YesNo::Yes
    }
}

/// `pfs-agent setup ...`.
#[derive(Debug, Subcommand)]
pub enum SetupCommand {
    /// ENABLED/TIMED of instruments matching a LIKE pattern: `setup instruments 'wait/synch/%' --enabled no`.
    Instruments {
        /// SQL LIKE pattern over instrument names.
        pattern: String,
        /// New ENABLED.
        #[arg(long, value_enum)]
        enabled: Option<YesNo>,
        /// New TIMED.
        #[arg(long, value_enum)]
        timed: Option<YesNo>,
        #[command(flatten)]
        /// Target.
        target: TargetArgs,
    },
    /// Consumers matching a LIKE pattern: `setup consumers 'events_waits_history_long' --enabled yes`.
    Consumers {
        /// SQL LIKE pattern over consumer names.
        pattern: String,
        /// New ENABLED.
        #[arg(long, value_enum)]
        enabled: YesNo,
        #[command(flatten)]
        /// Target.
        target: TargetArgs,
    },
    /// The timer of an event kind: `setup timers stage NANOSECOND`.
    Timers {
        /// `wait`, `stage`, `statement` (or a LIKE pattern).
        name: String,
        /// CYCLE, NANOSECOND, MICROSECOND, MILLISECOND or TICK.
        timer_name: String,
        #[command(flatten)]
        /// Target.
        target: TargetArgs,
    },
    /// Insert, update (`--enabled/--history`; a column not given keeps its
    /// value, YES in a new row) or `--delete` a setup_actors row (48 at most).
    Actors {
        /// HOST (`%` = any).
        #[arg(long, default_value = "%")]
        host: String,
        /// USER (`%` = any).
        #[arg(long, default_value = "%")]
        user: String,
        /// ROLE (`%` = any).
        #[arg(long, default_value = "%")]
        role: String,
        /// ENABLED.
        #[arg(long, value_enum)]
        enabled: Option<YesNo>,
        /// HISTORY.
        #[arg(long, value_enum)]
        history: Option<YesNo>,
        /// Delete the row.
        #[arg(long, conflicts_with_all = ["enabled", "history"])]
        delete: bool,
        #[command(flatten)]
        /// Target.
        target: TargetArgs,
    },
}

/// Output format of `query`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// Aligned text table.
    Text,
    /// One column per line, each row under a `*** N. row ***` header, as
    /// MySQL's `\G`: for tables too wide for the terminal.
    Vertical,
    /// The API's JSON object.
    Json,
}

/// The tables `query` prints, for its help.
fn query_tables() -> String {
    format!("Tables:\n  {}", pfs_agent::tables::names().join("\n  "))
}

/// `query` options.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Table name (e.g. events_waits_summary_global_by_event_name).
    pub table: String,
    #[command(flatten)]
    /// Segment directory.
    pub dir: DirArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Text: durations as MySQL's FORMAT_PICO_TIME shows them (471.87 ms),
    /// the default when stdout is a terminal. JSON stays in picoseconds.
    #[arg(long, conflicts_with = "raw_times")]
    pub human_times: bool,
    /// Text: durations in picoseconds, as stored (the default when stdout
    /// is not a terminal).
    #[arg(long)]
    pub raw_times: bool,
    /// Only this service.
    #[arg(long)]
    pub service: Option<String>,
    /// Only this pid.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Option<u32>,
    /// Only the rows whose COLUMN reads VALUE (NULL: an empty cell), as
    /// MySQL compares: text regardless of case, numbers by value (times in
    /// ps, as with --raw-times); repeatable, every one must hold (e.g.
    /// end_event_id=NULL: the events still running).
    #[arg(long = "where", value_name = "COLUMN=VALUE", value_parser = parse_where)]
    pub filters: Vec<(String, String)>,
    /// Only these columns, in this order (comma-separated, e.g.
    /// thread_id,event_name,timer_wait,sql_text).
    #[arg(long, value_delimiter = ',', value_name = "COLUMN,...")]
    pub columns: Vec<String>,
    /// Rows sorted by this column (ascending, NULL first; see --desc).
    #[arg(long, value_name = "COLUMN")]
    pub order_by: Option<String>,
    /// With --order-by: descending (largest first, NULL last).
    #[arg(long, requires = "order_by")]
    pub desc: bool,
    /// At most this many rows (after --order-by).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    #[command(flatten)]
    /// Which segment files are accepted.
    pub policy: PolicyArgs,
}

/// `demo` options.
#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address to serve on.
    #[arg(long, default_value_t = DEMO_LISTEN, value_parser = parse_listen)]
    pub listen: SocketAddr,
    #[command(flatten)]
    /// The Host check of loopback requests.
    pub hosts: HostArgs,
    /// Segment directory (default: a fresh private directory, removed at exit).
    #[arg(long)]
    pub shm_dir: Option<PathBuf>,
    /// File holding the control bearer token.
    #[arg(long)]
    pub control_token_file: Option<PathBuf>,
    /// Worker threads of the workload (1 to 256).
    #[arg(long, default_value_t = DEFAULT_WORKERS, value_parser = parse_workers)]
    pub workers: usize,
    #[command(flatten)]
    /// Setup defaults.
    pub defaults: DefaultsArgs,
    #[command(flatten)]
    /// OTLP metrics push.
    pub otlp: OtlpArgs,
}

/// Hidden `workload` options.
#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// Segment directory.
    #[arg(long, env = SHM_DIR_ENV)]
    pub shm_dir: PathBuf,
    /// Service name; without the flag, PFS_SERVICE_NAME if set, else
    /// kvstore-demo.
    #[arg(long, default_value = "kvstore-demo", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub service: String,
    /// Directory of the write-ahead log.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Worker threads (1 to 256).
    #[arg(long, default_value_t = DEFAULT_WORKERS, value_parser = parse_workers)]
    pub workers: usize,
}

/// A `--workers` count: 1 to 256.
#[cfg(feature = "demo")]
fn parse_workers(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n @ 1..=256) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of worker threads from 1 to 256"
        )),
    }
}

/// A connection timeout: a duration above zero (0 would end every
/// connection at once).
fn parse_timeout(s: &str) -> Result<HumanDuration, String> {
    match s.parse::<HumanDuration>() {
        Ok(d) if d.0.is_zero() => Err(format!(
            "{s:?}: a timeout of 0 would end every connection at once; give a duration such as 10s"
        )),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// `--max-segment-size`: above zero (0 would refuse every segment).
fn parse_max_size(s: &str) -> Result<ByteSize, String> {
    match s.parse::<ByteSize>() {
        Ok(b) if b.0 == 0 => Err(format!(
            "{s:?}: 0 would refuse every segment; give a size such as 1G"
        )),
        Ok(b) => Ok(b),
        Err(e) => Err(e.to_string()),
    }
}

/// `--forget-retired-after`: a duration, or `None` for `never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForgetAfter(pub Option<Duration>);

fn parse_forget_after(text: &str) -> Result<ForgetAfter, String> {
    if text.trim().eq_ignore_ascii_case("never") {
        return Ok(ForgetAfter(None));
    }
    parse_duration(text)
        .map(|d| ForgetAfter(Some(d)))
        .map_err(|e| format!("{e}; or never"))
}

/// `--where COLUMN=VALUE`.
fn parse_where(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((c, v)) if !c.is_empty() => Ok((c.to_string(), v.to_string())),
        _ => Err(format!(
            "{s:?} is not COLUMN=VALUE (e.g. end_event_id=NULL)"
        )),
    }
}

/// A `--listen` address: `ADDR:PORT`, or `HOST:PORT` with a host name
/// resolved now (its first IPv4 address, else its first: `localhost`
/// listens on 127.0.0.1, where `curl localhost` connects first); the
/// error shows the forms.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let s = s.trim();
    let hint = format!(
        "expected ADDR:PORT such as 0.0.0.0:{DEFAULT_PORT}, 127.0.0.1:{DEFAULT_PORT} or [::]:{DEFAULT_PORT}, or HOST:PORT such as localhost:{DEFAULT_PORT}"
    );
    let parse_error = match s.parse::<SocketAddr>() {
        Ok(a) => return Ok(a),
        Err(e) => e,
    };
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{parse_error}; {hint}"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() || host.contains(':') {
        return Err(format!("{parse_error}; {hint}"));
    }
    let found: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e}; {hint}"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("{host:?} has no address; {hint}"))
}

/// Reads a token file: non-empty, first line, trimmed.
pub fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let raw = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = raw.lines().next().unwrap_or("").trim().to_string();
    anyhow::ensure!(
        !token.is_empty(),
        "token file {} is empty; put the token on its first line",
        path.display()
    );
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn listen_takes_an_address_or_a_host_name() {
        assert_eq!(parse_listen(" [::]:9464").unwrap().to_string(), "[::]:9464");
        assert_eq!(parse_listen("0.0.0.0:1").unwrap().to_string(), "0.0.0.0:1");
        assert_eq!(
            parse_listen("localhost:9464").unwrap().to_string(),
            "127.0.0.1:9464"
        );
        for bad in ["9464", "localhost", "localhost:99999", ":9464", "::1:9464"] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
    }

    /// Every flag of `serve` is in the README's synopsis (the OTLP ones in
    /// docs/OTLP.md, which lists them all), and every variable a flag
    /// reads is named in the README or a doc: flags added without docs
    /// fail here.
    #[test]
    fn the_docs_name_every_serve_flag_and_variable() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).unwrap();
        let readme = read("README.md");
        let otlp = read("docs/OTLP.md");
        let mut docs = readme.clone();
        for e in std::fs::read_dir(format!("{root}/docs")).unwrap().flatten() {
            docs.push_str(&std::fs::read_to_string(e.path()).unwrap());
        }
        let synopsis = readme
            .split("pfs-agent serve --shm-dir")
            .nth(1)
            .and_then(|s| s.split("```").next())
            .expect("the README's serve synopsis");
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").expect("serve");
        let mut missing = Vec::new();
        for arg in serve.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                let flag = format!("--{long}");
                let (where_, text) = if long.starts_with("otlp-") {
                    ("docs/OTLP.md", otlp.as_str())
                } else {
                    ("the README's serve synopsis", synopsis)
                };
                let named = text.match_indices(&flag).any(|(i, _)| {
                    !text[i + flag.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
                });
                if !named {
                    missing.push(format!("{flag} is not in {where_}"));
                }
            }
            if let Some(var) = arg.get_env().and_then(|v| v.to_str())
                && !docs.contains(var)
            {
                missing.push(format!("{var} is not in the README or docs/"));
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
        empty_shm_dir_is_unset(Cli::command()).debug_assert();
    }

    /// With `PFS_SHM_DIR` empty, the flags with a default stop reading it
    /// (in every subcommand, nested ones included), and the others refuse
    /// the empty value naming the variable. The process's variable is not
    /// touched here: `tests/tests/deploy_signals.rs` and
    /// `agent/tests/robustness_fs_agent.rs` run the binary with it empty.
    #[test]
    fn an_empty_pfs_shm_dir_is_unset() {
        let cmd = empty_shm_dir_is_unset(Cli::command());
        let env_of = |path: &[&str]| {
            let mut c = &cmd;
            for name in path {
                c = c.find_subcommand(name).expect(name);
            }
            let arg = c.get_arguments().find(|a| a.get_id() == "shm_dir");
            arg.expect("--shm-dir").get_env().map(|v| v.to_owned())
        };
        for path in [&["serve"][..], &["query"], &["setup", "instruments"]] {
            assert_eq!(env_of(path), None, "{path:?}");
        }
        let parse = |args: &[&str]| {
            let m = cmd.clone().try_get_matches_from(args)?;
            Cli::from_arg_matches(&m)
        };
        let Command::Serve(a) = parse(&["pfs-agent", "serve"]).unwrap().command else {
            panic!("serve")
        };
        assert_eq!(
            a.dir.shm_dir,
            PathBuf::from(pfs_shm_layout::files::DEFAULT_SHM_DIR)
        );
        #[cfg(feature = "demo")]
        {
            assert_eq!(env_of(&["workload"]).as_deref(), Some(SHM_DIR_ENV.as_ref()));
            // The value the variable gives, as clap hands it over.
            let e = parse(&["pfs-agent", "workload", "--shm-dir", "", "--data-dir", "d"])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("PFS_SHM_DIR is set but empty") && e.contains("--shm-dir DIR"),
                "{e}"
            );
            let Command::Workload(a) =
                parse(&["pfs-agent", "workload", "--shm-dir", "s", "--data-dir", "d"])
                    .unwrap()
                    .command
            else {
                panic!("workload")
            };
            assert_eq!(a.shm_dir, PathBuf::from("s"));
        }
    }

    /// Defaults are written once (in the library) and shown as they were.
    #[test]
    fn defaults_come_from_the_library() {
        let cli = Cli::try_parse_from(["pfs-agent", "serve"]).unwrap();
        let Command::Serve(a) = cli.command else {
            panic!("serve")
        };
        let l = a.limits.limits();
        assert_eq!(l.max_connections, Limits::DEFAULT.max_connections);
        assert_eq!(l.header_timeout, Duration::from_secs(10));
        assert_eq!(l.connection_timeout, Duration::from_secs(60));
        assert_eq!(a.policy.policy().max_size, 4 << 30);
        assert_eq!(
            a.dead_retention,
            pfs_agent::segments::DEFAULT_DEAD_RETENTION
        );
        assert_eq!(
            a.forget_retired_after.0,
            Some(pfs_agent::segments::DEFAULT_FORGET_RETIRED_AFTER)
        );
        assert_eq!(a.shutdown_delay, Duration::ZERO);
        assert_eq!(
            a.listen,
            "[::]:9464".parse::<SocketAddr>().unwrap(),
            "every interface, IPv6 and IPv4"
        );
        let help = Cli::command()
            .find_subcommand_mut("serve")
            .unwrap()
            .render_long_help()
            .to_string();
        for d in [
            "[default: 10s]",
            "[default: 60s]",
            "[default: 4G]",
            "[default: 256]",
        ] {
            assert!(help.contains(d), "serve --help lacks {d}");
        }
    }

    /// Flag values are read as the agent writes them, and a value that is
    /// not shows the expected form.
    #[test]
    fn flag_value_errors_show_the_expected_form() {
        let e = Cli::try_parse_from(["pfs-agent", "serve", "--listen", ":9464"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("expected ADDR:PORT such as 0.0.0.0:9464") && e.contains("[::]:9464"),
            "{e}"
        );
        // `query` prints minutes as `min`.
        let cli = Cli::try_parse_from(["pfs-agent", "serve", "--dead-retention", "5min"]).unwrap();
        let Command::Serve(a) = cli.command else {
            panic!("serve")
        };
        assert_eq!(a.dead_retention, Duration::from_secs(300));
        let e = Cli::try_parse_from(["pfs-agent", "serve", "--dead-retention", "5y"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("use ms, s, m (or min), h or d"), "{e}");
        for (text, want) in [
            ("never", None),
            ("NEVER", None),
            ("30m", Some(Duration::from_secs(1800))),
        ] {
            let cli = Cli::try_parse_from(["pfs-agent", "serve", "--forget-retired-after", text])
                .unwrap();
            let Command::Serve(a) = cli.command else {
                panic!("serve")
            };
            assert_eq!(a.forget_retired_after.0, want, "{text}");
        }
        let e = Cli::try_parse_from(["pfs-agent", "serve", "--forget-retired-after", "soon"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("or never"), "{e}");
    }
}
