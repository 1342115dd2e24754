//! The `Host` check that keeps DNS rebinding out. A web page open in a
//! browser on this machine can point a name of its own at `127.0.0.1`
//! and then read what the agent serves there (statement texts included)
//! as if it were its own site. Such a request arrives on a loopback
//! address with the page's name in its `Host` header. So a request that
//! arrives on a loopback address must name the agent by an IP address,
//! `localhost` (or a name under `.localhost`), this machine's host name,
//! a name of `/etc/hosts` (local names a page cannot control), or a name
//! allowed with `--allowed-host` (`*`: any). Requests that arrive on
//! another address (a scraper using the pod's IP, or any DNS name) are
//! not checked by default: whoever reaches that address can connect
//! anyway; but a page can also rebind a name to the machine's LAN
//! address, and a port forwarded to the agent (a container's published
//! port) arrives on the forwarder's address: `--host-check all` checks
//! every connection ([`Scope`]). Refused requests get `403` and a JSON
//! error that says what to use instead, logged as a warning once per
//! `Host` every [`LOG_PERIOD`].

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::util::host::host_name;

/// The file of the machine's own names.
const ETC_HOSTS: &str = "/etc/hosts";

/// How long the names read from [`ETC_HOSTS`] are used before it is read
/// again.
const ETC_HOSTS_TTL: Duration = Duration::from_secs(5);

/// At most this many refusals are logged per [`LOG_PERIOD`], each the
/// first of its `Host` in the period.
const LOGGED_NAMES: usize = 64;

/// How long a refused `Host` stays known as logged.
const LOG_PERIOD: Duration = Duration::from_secs(600);

/// Which connections' `Host` headers are checked (`--host-check`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Scope {
    /// Those that arrive on a loopback address (the default).
    #[default]
    Loopback,
    /// Every connection: also a name rebound to the machine's LAN address,
    /// and a port forwarded to the agent (`docker run -p`). A scraper that
    /// names the agent by a DNS name then needs it in `--allowed-host`
    /// (addresses always pass: Prometheus's pod targets are addresses).
    All,
}

/// Which `Host` headers a connection may send.
#[derive(Debug)]
pub struct HostCheck {
    /// `--allowed-host '*'`: no check.
    any: bool,
    /// Which connections are checked.
    scope: Scope,
    /// Names accepted besides IP addresses and `localhost`: the allowed
    /// ones and this machine's host name (lowercase, without a final dot).
    names: Vec<String>,
    /// Refused `Host`s logged in the current period, and its start.
    logged: Mutex<(Instant, BTreeSet<String>)>,
    /// The names of [`ETC_HOSTS`] and when they were read.
    etc_hosts: Mutex<Option<(Instant, Vec<String>)>>,
}

/// Why an `--allowed-host` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a host name; give a name such as metrics.example (no port, no pattern; addresses are always accepted), or '*' to accept any"
)]
pub struct BadHostName(pub String);

/// An `--allowed-host` value as the check keeps it: a name (its port, if
/// given, dropped), or `*`. Empty values are no names (`PFS_ALLOWED_HOSTS=`).
pub fn parse_allowed_host(value: &str) -> Result<String, BadHostName> {
    let v = value.trim();
    if v == "*" || v.is_empty() {
        return Ok(v.to_string());
    }
    let name = normalise(host_part(v).unwrap_or(""));
    if plausible_name(&name) || name.parse::<IpAddr>().is_ok() {
        Ok(name)
    } else {
        Err(BadHostName(value.to_string()))
    }
}

impl HostCheck {
    /// The check of `scope`'s connections with the names of
    /// `--allowed-host` (`*` turns it off), as [`parse_allowed_host`]
    /// reads them (a value it refuses names nothing).
    pub fn new(allowed: &[String], scope: Scope) -> Self {
        let any = allowed.iter().any(|a| a.trim() == "*");
        let names = allowed
            .iter()
            .cloned()
            .chain(host_name())
            .filter_map(|n| parse_allowed_host(&n).ok())
            .filter(|n| !n.is_empty() && n != "*")
            .collect();
        Self {
            any,
            scope,
            names,
            logged: Mutex::new((Instant::now(), BTreeSet::new())),
            etc_hosts: Mutex::new(None),
        }
    }

    /// What a loopback request may name besides addresses and
    /// `localhost`, for the start-up log (`*`: anything).
    pub fn describe(&self) -> String {
        if self.any {
            return "*".to_string();
        }
        let mut d = vec!["addresses", "localhost", "names in /etc/hosts"];
        d.extend(self.names.iter().map(String::as_str));
        d.join(", ")
    }

    /// Why a request whose `Host` headers (all of them: more than one is
    /// refused) and request target's authority (if absolute) are these,
    /// which arrived on `local`, is refused; `None` if it is served.
    pub fn refusal<'a>(
        &self,
        local: SocketAddr,
        hosts: impl IntoIterator<Item = &'a str>,
        authority: Option<&str>,
    ) -> Option<String> {
        let loopback = local.ip().to_canonical().is_loopback();
        if self.any || (self.scope == Scope::Loopback && !loopback) {
            return None;
        }
        let mut hosts: Vec<&str> = hosts.into_iter().collect();
        hosts.extend(authority);
        if hosts.is_empty() {
            return None; // an HTTP/1.0 client
        }
        let names: BTreeSet<Option<String>> =
            hosts.iter().map(|h| host_part(h).map(normalise)).collect();
        let one_name = match (names.len(), names.iter().next()) {
            (1, Some(Some(name))) => Some(name.as_str()),
            _ => None,
        };
        if one_name.is_some_and(|n| self.serves(n)) {
            return None;
        }
        let shown = hosts.join(", ");
        let local = SocketAddr::new(local.ip().to_canonical(), local.port());
        let allow = match one_name {
            Some(n) if plausible_name(n) => format!(", or start the agent with --allowed-host {n}"),
            _ => String::new(),
        };
        let on = if loopback {
            "on a loopback address"
        } else {
            "(--host-check all)"
        };
        let localhost = if loopback {
            format!(" or http://localhost:{}/", local.port())
        } else {
            String::new()
        };
        let why = format!(
            "Host {shown:?} is not accepted {on} (a web page could otherwise read this \
             agent through DNS rebinding): use http://{local}/{localhost}{allow} ('*' \
             accepts any name)"
        );
        self.log_first(&shown, &why);
        Some(why)
    }

    /// Whether a request naming `name` (normalised) is served.
    fn serves(&self, name: &str) -> bool {
        name.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.names.iter().any(|n| n == name)
            || self.in_etc_hosts(name)
    }

    /// Whether `name` (normalised) is one of the names of [`ETC_HOSTS`]:
    /// a local file a web page cannot change. Read when a name is not
    /// otherwise served, at most every [`ETC_HOSTS_TTL`] (a name added to
    /// it counts from then; a flood of refused requests reads it no more).
    fn in_etc_hosts(&self, name: &str) -> bool {
        let mut cached = self.etc_hosts.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = cached
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < ETC_HOSTS_TTL);
        if !fresh {
            *cached = Some((Instant::now(), hosts_file_names(ETC_HOSTS)));
        }
        cached
            .as_ref()
            .is_some_and(|(_, names)| names.iter().any(|n| n == name))
    }

    /// Logs the first refusal of each `Host` in a [`LOG_PERIOD`], at most
    /// [`LOGGED_NAMES`] a period: a misconfigured scraper is seen, a page
    /// retrying (or cycling names) does not flood the log.
    fn log_first(&self, host: &str, why: &str) {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let (since, hosts) = &mut *logged;
        if since.elapsed() >= LOG_PERIOD {
            (*since, *hosts) = (Instant::now(), BTreeSet::new());
        }
        if hosts.len() < LOGGED_NAMES && hosts.insert(host.to_string()) {
            tracing::warn!("request refused: {why}");
        }
    }
}

/// Checks every loopback request, with no name allowed but this
/// machine's.
impl Default for HostCheck {
    fn default() -> Self {
        Self::new(&[], Scope::Loopback)
    }
}

/// The host of a `Host` header value: without its port, and an IPv6
/// address without its brackets; `None` if it is malformed (anything but
/// a port after the brackets, a port that is not a number).
fn host_part(host: &str) -> Option<&str> {
    let host = host.trim();
    let (name, port) = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']')? {
            (address, "") => (address, None),
            (address, rest) => (address, Some(rest.strip_prefix(':')?)),
        },
        None => match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    match port {
        Some(p) if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) => None,
        _ => Some(name),
    }
}

/// A name as compared: lowercase, without a final dot.
fn normalise(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `name` (normalised) is written as a DNS name: letters, digits,
/// `-` and `.`, not empty.
fn plausible_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// The names of a hosts file (`/etc/hosts`'s format), normalised (none if
/// it cannot be read).
fn hosts_file_names(path: impl AsRef<std::path::Path>) -> Vec<String> {
    let Ok(hosts) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    hosts
        .lines()
        .flat_map(|line| {
            let line = line.split('#').next().unwrap_or("");
            line.split_whitespace().skip(1).map(normalise)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addr: &str) -> SocketAddr {
        addr.parse().unwrap()
    }

    fn refused(check: &HostCheck, local: &str, hosts: &[&str], authority: Option<&str>) -> bool {
        check
            .refusal(at(local), hosts.iter().copied(), authority)
            .is_some()
    }

    #[test]
    fn loopback_requests_must_name_the_agent() {
        let allowed = parse_allowed_host("Metrics.Example.:9464").unwrap();
        assert_eq!(allowed, "metrics.example");
        let check = HostCheck::new(&[allowed], Scope::Loopback);
        let lo = "127.0.0.1:9464";
        for ok in [
            "127.0.0.1:9464",
            "127.0.0.1",
            "[::1]:9464",
            "[::1]",
            "localhost:9464",
            "LOCALHOST",
            "localhost.",
            "app.localhost:9464",
            "10.1.2.3:9464",
            "metrics.example:9464",
            "metrics.example",
        ] {
            assert!(!refused(&check, lo, &[ok], None), "{ok}");
        }
        assert!(!refused(&check, lo, &[], None), "HTTP/1.0: no Host");
        let name = host_name().unwrap();
        assert!(!refused(&check, lo, &[&format!("{name}:9464")], None));
        for bad in [
            "evil.example:9464",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:9464",
            "[::1]evil.example",
            "[::1]:x",
            "::1",
            "localhost:",
            "localhost:http",
        ] {
            assert!(refused(&check, lo, &[bad], None), "{bad}");
        }
        let why = check.refusal(at(lo), ["evil.example:9464"], None).unwrap();
        assert!(
            why.contains("http://127.0.0.1:9464/") && why.contains("--allowed-host evil.example"),
            "{why}"
        );
        // The address the request came in on, and no flag for a name that
        // cannot be one.
        let why = check.refusal(at("[::1]:9464"), ["ev il"], None).unwrap();
        assert!(
            why.contains("http://[::1]:9464/") && !why.contains("--allowed-host ev"),
            "{why}"
        );
        // Two Host headers, or an absolute target naming another host.
        assert!(refused(&check, lo, &["localhost", "evil.example"], None));
        assert!(refused(&check, lo, &["localhost"], Some("evil.example")));
        assert!(!refused(&check, lo, &["localhost"], Some("localhost:9464")));
        // The same on IPv6 and IPv4-mapped loopback addresses.
        assert!(refused(&check, "[::1]:9464", &["evil.example"], None));
        assert!(refused(
            &check,
            "[::ffff:127.0.0.1]:9464",
            &["evil.example"],
            None
        ));
    }

    #[test]
    fn other_addresses_and_a_star_are_not_checked() {
        let check = HostCheck::default();
        assert!(!refused(&check, "10.0.0.5:9464", &["evil.example"], None));
        assert!(!refused(&check, "[fd00::5]:9464", &["evil.example"], None));
        let any = HostCheck::new(&["*".to_string()], Scope::All);
        assert!(!refused(&any, "127.0.0.1:9464", &["evil.example"], None));
        assert_eq!(any.describe(), "*");
    }

    #[test]
    fn scope_all_checks_every_address() {
        let check = HostCheck::new(&["scrape.example".to_string()], Scope::All);
        let lan = "10.0.0.5:9464";
        assert!(!refused(&check, lan, &["10.0.0.5:9464"], None));
        assert!(!refused(&check, lan, &["scrape.example:9464"], None));
        let why = check.refusal(at(lan), ["evil.example"], None).unwrap();
        assert!(
            why.contains("(--host-check all)")
                && why.contains("http://10.0.0.5:9464/")
                && !why.contains("localhost:"),
            "{why}"
        );
    }

    #[test]
    fn allowed_host_values_are_names() {
        assert_eq!(parse_allowed_host(" * ").unwrap(), "*");
        assert_eq!(parse_allowed_host("").unwrap(), "");
        assert_eq!(parse_allowed_host("[::1]:80").unwrap(), "::1");
        for bad in ["*.example.com", "http://x", "a b", "x:y"] {
            assert!(parse_allowed_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_of_a_hosts_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(
            &path,
            "127.0.0.1 localhost\n127.0.1.1\tVM.Example.org. vm # the FQDN\n# 10.0.0.1 commented\n",
        )
        .unwrap();
        assert_eq!(
            hosts_file_names(&path),
            ["localhost", "vm.example.org", "vm"]
        );
        assert!(hosts_file_names(dir.path().join("none")).is_empty());
    }
}
