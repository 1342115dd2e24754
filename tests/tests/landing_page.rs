//! The landing page at `GET /`, in a real headless browser (Debian's
//! `chromium`; scripts/test installs it): a real agent over a real
//! segment of `pfs-test-writer`.
//!
//! * `GET /` is `200 text/html`, self-contained, and links `/metrics`,
//!   `/healthz`, `/api/v1/tables` and every table the agent serves (its
//!   own list, `GET /api/v1/tables`).
//! * After its script ran (`chromium --dump-dom`), the table browser shows
//!   the writer's rows of `events_waits_summary_global_by_event_name`,
//!   durations readable (`12.34 us`, the picoseconds in the tooltip). A
//!   screenshot is left in Cargo's target tmp dir for a human to look at.
//! * With a read token, the page is served (it holds no data) but shows
//!   none: the browser's read gets 401 and the page asks for the token.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pfs_tests::{Agent, TEST_CLASSES, http_get, poll, spawn_exact, writer_exe};

const TABLE: &str = "events_waits_summary_global_by_event_name";

fn chromium() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("chromium"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "the `chromium` browser is not on PATH; run scripts/test, which installs it \
                 (apt-get install chromium), or install it yourself"
            )
        })
}

/// Runs headless chromium on `url` with `args` (`--dump-dom`,
/// `--screenshot=...`); its stdout.
fn browse(url: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let o = Command::new("timeout")
        .arg("90")
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=10000",
            "--window-size=1200,900",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "chromium failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The DOM of `url` once the page's script has filled the table browser
/// (`ready` says so), retried for a slow machine.
fn dom_when(url: &str, ready: impl Fn(&str) -> bool) -> String {
    poll(Duration::from_secs(180), || {
        let dom = browse(url, &["--dump-dom"]);
        Ok(ready(&dom).then_some(dom))
    })
    .unwrap_or_else(|e| {
        panic!(
            "the page never got ready: {e:#}\n{}",
            browse(url, &["--dump-dom"])
        )
    })
}

/// The text of every `<td>` of the table browser, row by row.
fn rows(dom: &str) -> Vec<Vec<String>> {
    let start = dom.find("<tbody>").expect("a tbody");
    let end = dom[start..].find("</tbody>").expect("</tbody>") + start;
    dom[start..end]
        .split("<tr>")
        .skip(1)
        .map(|tr| {
            tr.split("<td")
                .skip(1)
                .map(|td| {
                    let text = &td[td.find('>').unwrap() + 1..];
                    text[..text.find("</td>").unwrap()].to_string()
                })
                .collect()
        })
        .collect()
}

/// `12.34 us`, as FORMAT_PICO_TIME writes a duration of at least 1 ns.
fn is_readable_duration(s: &str) -> bool {
    let Some((num, unit)) = s.split_once(' ') else {
        return false;
    };
    let Some((int, frac)) = num.split_once('.') else {
        return false;
    };
    ["ns", "us", "ms", "s", "min", "h", "d"].contains(&unit)
        && !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.len() == 2
        && frac.bytes().all(|b| b.is_ascii_digit())
}

fn screenshot(url: &str, file: &Path) {
    let _ = std::fs::remove_file(file);
    browse(url, &[&format!("--screenshot={}", file.display())]);
    let png = std::fs::read(file).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} is not a screenshot ({} bytes)",
        file.display(),
        png.len()
    );
}

#[test]
fn the_landing_page_links_everything_and_browses_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let (_w, _) = spawn_exact(writer_exe!(), dir.path(), "landing", 2, 25, 0).unwrap();
    let agent = Agent::serve(dir.path()).unwrap();

    let page = agent.get("/").unwrap();
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(
        page.content_type.as_deref(),
        Some("text/html; charset=utf-8")
    );
    let html = &page.body;
    for path in ["/metrics", "/healthz", "/api/v1/tables"] {
        assert!(
            html.contains(&format!("href=\"{path}\"")),
            "no link to {path}"
        );
    }
    let served = pfs_tests::get_json(&format!("{}/api/v1/tables", agent.base)).unwrap();
    let names = served["tables"].as_array().unwrap();
    assert!(names.len() > 20, "{served}");
    for n in names {
        let n = n.as_str().unwrap();
        assert!(
            html.contains(&format!("href=\"/api/v1/tables/{n}\"")),
            "no link to {n}"
        );
        assert!(
            html.contains(&format!("<option value=\"{n}\">")),
            "{n} not offered"
        );
    }
    for external in ["http://", "https://", " src="] {
        assert!(!html.contains(external), "the page loads {external}...");
    }
    // The links answer.
    for path in ["/metrics", "/healthz", &format!("/api/v1/tables/{TABLE}")] {
        assert_eq!(
            http_get(&format!("{}{path}", agent.base)).unwrap().status,
            200
        );
    }

    // The browser: the writer's three instruments, with readable times.
    let url = format!("{}/#{TABLE}", agent.base);
    let dom = dom_when(&url, |d| {
        d.contains(TEST_CLASSES[2]) && d.contains("<tbody>")
    });
    assert!(dom.contains(&format!("{TABLE}: 3 rows.")), "status line");
    let mut rows = rows(&dom);
    rows.sort_by(|a, b| a[2].cmp(&b[2]));
    let mut classes = TEST_CLASSES;
    classes.sort_unstable();
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (row, class) in rows.iter().zip(classes) {
        // service, pid, event_name, count_star, then four durations.
        assert_eq!(row[0], "landing", "{row:?}");
        assert_eq!(row[2], class, "{row:?}");
        assert_eq!(row[3], "50", "{row:?}");
        for d in &row[4..8] {
            assert!(is_readable_duration(d), "{d:?} in {row:?}");
        }
    }
    assert!(
        dom.contains(" ps\">"),
        "durations keep their picoseconds in a tooltip"
    );

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("landing_page.png");
    screenshot(&url, &shot);
    eprintln!("landing_page: screenshot in {}", shot.display());
}

#[test]
fn with_a_read_token_the_page_shows_no_data_and_asks_for_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let token_file = secrets.path().join("read");
    std::fs::write(&token_file, "read-secret-1234\n").unwrap();
    let (_w, _) = spawn_exact(writer_exe!(), dir.path(), "secretsvc", 1, 5, 0).unwrap();
    let agent = Agent::serve_with_env(
        dir.path(),
        &[(
            "PFS_READ_TOKEN_FILE",
            token_file.to_string_lossy().into_owned(),
        )],
    )
    .unwrap();
    let page = agent.get("/").unwrap();
    assert_eq!(page.status, 200, "the page is served without the token");
    assert!(!page.body.contains("secretsvc"), "and holds no data");
    assert_eq!(
        agent
            .get(&format!("/api/v1/tables/{TABLE}"))
            .unwrap()
            .status,
        401
    );

    let dom = dom_when(&format!("{}/#{TABLE}", agent.base), |d| {
        d.contains("read token (--read-token-file)")
    });
    assert!(!dom.contains("secretsvc"), "no row reached the page");
    assert!(
        dom.contains("<form class=\"browse\" id=\"auth\">"),
        "the token form is shown (not hidden)"
    );
}
