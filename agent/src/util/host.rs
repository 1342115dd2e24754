//! This machine's host name, as the kernel has it (`uname -n`), for what
//! names the machine: OTLP's `host.name`, and the `Host` headers the
//! HTTP server accepts on loopback connections.

/// The host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`), if the
/// machine has one.
pub fn host_name() -> Option<String> {
    host_name_or(std::env::var("HOSTNAME").ok())
}

/// The host name of `/proc/sys/kernel/hostname`, else `fallback` (the
/// value of `$HOSTNAME`, as a caller with its own view of the environment
/// reads it).
pub fn host_name_or(fallback: Option<String>) -> Option<String> {
    let nonempty = |s: Option<String>| s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    nonempty(std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| nonempty(fallback))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_linux_machine_has_a_host_name() {
        let name = super::host_name().expect("a host name");
        assert!(
            !name.is_empty() && !name.contains(char::is_whitespace),
            "{name:?}"
        );
    }
}
