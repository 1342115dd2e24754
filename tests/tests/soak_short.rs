//! The soak of scripts/soak (docs/SOAK.md) at CI size, so that it cannot
//! rot: 15 s of torn writers, thread churn and page reclamation against
//! the validating reader and a real agent must end with its one line,
//! with reads validated and every trouble figure 0.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use pfs_tests::{ChildGuard, agent_bin};

#[test]
fn a_short_soak_validates_reads_and_finds_nothing() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pfs-soak"));
    cmd.args(["--seconds", "15", "--agent"]).arg(agent_bin());
    let mut soak = ChildGuard::spawn("pfs-soak", cmd, false).unwrap();
    let status = soak
        .wait_timeout(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("the soak did not end within 120 s\n{}", soak.describe()));
    let stdout = soak.stdout();
    let lines: Vec<&str> = stdout.lines().collect();
    let [line] = lines.as_slice() else {
        panic!(
            "expected exactly one line on stdout (status {status})\n{}",
            soak.describe()
        )
    };
    eprintln!("{}\n{line}", soak.stderr());
    let rest = line
        .strip_prefix("soak: ")
        .unwrap_or_else(|| panic!("not the soak line: {line:?}"));
    let fields: Vec<(&str, &str)> = rest
        .split(' ')
        .map(|kv| {
            kv.split_once('=')
                .unwrap_or_else(|| panic!("field {kv:?} in {line:?}"))
        })
        .collect();
    let keys: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "minutes",
            "reads_validated",
            "torn_accepted",
            "decreases",
            "lost_or_doubled"
        ],
        "{line}"
    );
    let f: BTreeMap<&str, &str> = fields.into_iter().collect();
    assert_eq!(f["minutes"], "0.25", "{line}");
    let n = |k: &str| -> u64 {
        f[k].parse()
            .unwrap_or_else(|_| panic!("{k} is not a number in {line}"))
    };
    assert_eq!(n("torn_accepted"), 0, "{line}\n{}", soak.stderr());
    assert_eq!(n("decreases"), 0, "{line}\n{}", soak.stderr());
    assert_eq!(n("lost_or_doubled"), 0, "{line}\n{}", soak.stderr());
    assert!(
        n("reads_validated") > 10_000,
        "too few reads validated: {line}"
    );
    assert!(
        status.success(),
        "the soak failed ({status})\n{}",
        soak.describe()
    );
}
