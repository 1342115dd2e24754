//! Access: the read token (401 without, 200 with; the control token reads
//! too, the read token never controls; `/healthz` stays open), and the
//! modes of what lands in the segment directory (segments 0600 and their
//! directory 0700, or 0660/0770 with `PFS_GROUP_ACCESS=1`, whatever the
//! umask; a world-writable directory refused; the agent's own state and
//! lock files 0600).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use pfs_tests::{Agent, Writer, spawn_exact, writer_exe};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// `GET` (or `POST` with `body`) with an optional bearer token; the status.
fn status(url: &str, token: Option<&str>, body: Option<&str>) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let auth = token.map(|t| format!("Bearer {t}"));
    let r = match body {
        None => {
            let mut req = agent.get(url);
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.call()
        }
        Some(b) => {
            let mut req = agent.post(url).header("Content-Type", "application/json");
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.send(b)
        }
    };
    r.unwrap_or_else(|e| panic!("{url}: {e}")).status().as_u16()
}

#[test]
fn read_token_guards_reads_but_not_health() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let (read, control) = ("read-secret-1234", "control-secret-5678");
    let read_file = secrets.path().join("read");
    let control_file = secrets.path().join("control");
    std::fs::write(&read_file, format!("{read}\n")).unwrap();
    std::fs::write(&control_file, format!("{control}\n")).unwrap();
    let (_w, _) = spawn_exact(writer_exe!(), dir.path(), "tok", 1, 5, 0).unwrap();
    let agent = Agent::serve_with_env(
        dir.path(),
        &[
            (
                "PFS_READ_TOKEN_FILE",
                read_file.to_string_lossy().into_owned(),
            ),
            (
                "PFS_CONTROL_TOKEN_FILE",
                control_file.to_string_lossy().into_owned(),
            ),
        ],
    )
    .unwrap();
    let b = &agent.base;
    for path in [
        "/metrics",
        "/api/v1/tables",
        "/api/v1/tables/events_waits_summary_global_by_event_name",
    ] {
        let url = format!("{b}{path}");
        assert_eq!(status(&url, None, None), 401, "{path} without a token");
        assert_eq!(
            status(&url, Some("wrong"), None),
            401,
            "{path} with a wrong token"
        );
        assert_eq!(
            status(&url, Some(&read[..read.len() - 1]), None),
            401,
            "{path} with a prefix of the token"
        );
        assert_eq!(
            status(&url, Some(read), None),
            200,
            "{path} with the read token"
        );
        assert_eq!(
            status(&url, Some(control), None),
            200,
            "{path} with the control token"
        );
    }
    assert_eq!(
        status(&format!("{b}/healthz"), None, None),
        200,
        "/healthz stays open"
    );
    // The read token does not grant control; the control token does.
    let setup = format!("{b}/api/v1/setup/consumers");
    let body = r#"{"name": "events_waits_history", "enabled": true}"#;
    assert_eq!(status(&setup, Some(read), Some(body)), 401);
    assert_eq!(status(&setup, Some(control), Some(body)), 200);
    // With a token, the body really is the metrics.
    let r = ureq::get(&format!("{b}/metrics"))
        .header("Authorization", &format!("Bearer {read}"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(
        r.contains("pfs_events_waits_total{service=\"tok\""),
        "metrics body: {}",
        &r[..r.len().min(500)]
    );
}

#[test]
fn without_a_read_token_reads_are_open() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::serve(dir.path()).unwrap();
    assert_eq!(status(&format!("{}/metrics", agent.base), None, None), 200);
}

fn exact_args(dir: &Path, service: &str) -> Vec<String> {
    [
        writer_exe!().to_str().unwrap(),
        "exact",
        "--shm-dir",
        dir.to_str().unwrap(),
        "--service",
        service,
        "--threads",
        "1",
        "--per-class",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs the writer through `env` so that `PFS_GROUP_ACCESS` reaches it only.
fn writer_with_env(env: &[&str], dir: &Path, service: &str) -> Writer {
    let mut args: Vec<String> = env.iter().map(|s| s.to_string()).collect();
    args.extend(exact_args(dir, service));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Writer::spawn(Path::new("/usr/bin/env"), &args).unwrap()
}

#[test]
fn segment_files_and_directories_are_private() {
    let root = tempfile::tempdir().unwrap();
    // Default: the client creates the directory 0700 and the file 0600.
    let private = root.path().join("private");
    let mut w = writer_with_env(&["PFS_GROUP_ACCESS=0"], &private, "priv");
    let ready = w.read_json(Duration::from_secs(30)).unwrap();
    let seg = Path::new(ready["segment"].as_str().unwrap()).to_path_buf();
    assert_eq!(mode(&private), 0o700, "directory mode");
    assert_eq!(mode(&seg), 0o600, "segment mode");
    // With a group: 0770 and 0660, even under the usual 022 umask.
    let shared = root.path().join("shared");
    let mut g = writer_with_env(&["PFS_GROUP_ACCESS=1"], &shared, "grp");
    let ready = g.read_json(Duration::from_secs(30)).unwrap();
    let gseg = Path::new(ready["segment"].as_str().unwrap()).to_path_buf();
    assert_eq!(mode(&shared), 0o770, "group directory mode");
    assert_eq!(mode(&gseg), 0o660, "group segment mode");
    // Never world-writable: such a directory is refused.
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut o = writer_with_env(&[], &open, "open");
    let status = o.guard.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(!status.success(), "a world-writable directory was accepted");
    assert!(
        o.guard.stderr().contains("world-writable"),
        "{}",
        o.guard.describe()
    );
    assert_eq!(
        std::fs::read_dir(&open).unwrap().count(),
        0,
        "nothing created"
    );
    // The agent's own files in the directory are private too.
    let agent = Agent::serve(&private).unwrap();
    drop(w);
    pfs_tests::poll(Duration::from_secs(20), || {
        Ok(private
            .join(pfs_agent::retired::LOCK_FILE)
            .exists()
            .then_some(()))
    })
    .unwrap();
    assert_eq!(mode(&private.join(pfs_agent::retired::LOCK_FILE)), 0o600);
    drop(agent);
    g.finish(Duration::from_secs(10)).unwrap();
}
