//! The `Host` check that keeps DNS rebinding out. A web page open in a
//! browser on this machine can point a name of its own at `127.0.0.1`
//! and then read what the agent serves there (statement texts included)
//! as if it were its own site. Such a request arrives on a loopback
//! address with the page's name in its `Host` header. So a request that
//! arrives on a loopback address must name the agent by an IP address,
//! `localhost` (or a name under `.localhost`), this machine's host name,
//! or a name allowed with `--allowed-host` (`*`: any). Requests that
//! arrive on another address (a scraper using the pod's IP, or any DNS
//! name) are not checked: whoever reaches that address can connect
//! anyway. Refused requests get `403` and a JSON error that says what to
//! use instead.

use std::net::{IpAddr, SocketAddr};

use crate::util::host::host_name;

/// Which `Host` headers a loopback connection may send.
#[derive(Debug, Clone)]
pub struct HostCheck {
    /// `--allowed-host '*'`: no check.
    any: bool,
    /// Names accepted besides IP addresses and `localhost`: the allowed
    /// ones and this machine's host name (lowercase, without a final dot).
    names: Vec<String>,
}

impl HostCheck {
    /// The check with the names of `--allowed-host` (`*` turns it off).
    pub fn new(allowed: &[String]) -> Self {
        let any = allowed.iter().any(|a| a.trim() == "*");
        let names = allowed
            .iter()
            .cloned()
            .chain(host_name())
            .map(|n| normalise(&n))
            .filter(|n| !n.is_empty() && n != "*")
            .collect();
        Self { any, names }
    }

    /// Why a request with this `Host` header (none: an HTTP/1.0 client),
    /// which arrived on `local`, is refused; `None` if it is served.
    pub fn refusal(&self, local: SocketAddr, host: Option<&str>) -> Option<String> {
        if self.any || !local.ip().to_canonical().is_loopback() {
            return None;
        }
        let host = host?;
        let name = normalise(host_part(host));
        let served = name.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.names.contains(&name);
        (!served).then(|| {
            let port = local.port();
            format!(
                "Host {host:?} is not accepted on a loopback address (a web page could \
                 otherwise read this agent through DNS rebinding): use \
                 http://127.0.0.1:{port}/ or http://localhost:{port}/, or start the \
                 agent with --allowed-host {name} (--allowed-host '*' accepts any name)"
            )
        })
    }
}

/// Checks every loopback request, with no name allowed but this
/// machine's.
impl Default for HostCheck {
    fn default() -> Self {
        Self::new(&[])
    }
}

/// The host of a `Host` header value: without its port, and an IPv6
/// address without its brackets.
fn host_part(host: &str) -> &str {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// A name as compared: lowercase, without a final dot.
fn normalise(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addr: &str) -> SocketAddr {
        addr.parse().unwrap()
    }

    #[test]
    fn loopback_requests_must_name_the_agent() {
        let check = HostCheck::new(&["Metrics.Example.".to_string()]);
        let lo = at("127.0.0.1:9464");
        for ok in [
            "127.0.0.1:9464",
            "127.0.0.1",
            "[::1]:9464",
            "localhost:9464",
            "LOCALHOST",
            "localhost.",
            "app.localhost:9464",
            "10.1.2.3:9464",
            "metrics.example:9464",
            "metrics.example",
        ] {
            assert_eq!(check.refusal(lo, Some(ok)), None, "{ok}");
        }
        assert_eq!(check.refusal(lo, None), None, "HTTP/1.0: no Host");
        let name = host_name().unwrap();
        assert_eq!(check.refusal(lo, Some(&format!("{name}:9464"))), None);
        for bad in [
            "evil.example:9464",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:9464",
        ] {
            let why = check.refusal(lo, Some(bad)).expect(bad);
            assert!(
                why.contains("http://127.0.0.1:9464/") && why.contains("--allowed-host"),
                "{why}"
            );
        }
        // The same on IPv6 and IPv4-mapped loopback addresses.
        assert!(
            check
                .refusal(at("[::1]:9464"), Some("evil.example"))
                .is_some()
        );
        assert!(
            check
                .refusal(at("[::ffff:127.0.0.1]:9464"), Some("evil.example"))
                .is_some()
        );
    }

    #[test]
    fn other_addresses_and_a_star_are_not_checked() {
        let check = HostCheck::new(&[]);
        assert_eq!(
            check.refusal(at("10.0.0.5:9464"), Some("evil.example")),
            None
        );
        assert_eq!(
            check.refusal(at("[fd00::5]:9464"), Some("evil.example")),
            None
        );
        let any = HostCheck::new(&["*".to_string()]);
        assert_eq!(
            any.refusal(at("127.0.0.1:9464"), Some("evil.example")),
            None
        );
    }
}
