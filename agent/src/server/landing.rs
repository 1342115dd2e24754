//! The landing page at `GET /` (layer 7): one self-contained HTML page
//! (`landing.html`: inline CSS and script, no external asset) that links
//! `/metrics`, `/healthz` and every table of the registry, with a small
//! table browser that reads the JSON API from the page.
//!
//! The page holds no data: its links and the table names are the same on
//! every agent of a version, so it is served without the read token, like
//! `/healthz`. The browser's requests go through the API, which still
//! needs the token when one is configured: on a 401 the page asks for it
//! and sends it as `Authorization: Bearer` (kept in the page's memory
//! only). Cells are set as text, never parsed as HTML, since rows come
//! from instrumented processes.

use std::sync::OnceLock;

use hyper::StatusCode;
use hyper::header::{CACHE_CONTROL, HeaderName, HeaderValue};

use super::body::{Resp, reply};
use crate::tables;

/// The page, with `{{TABLE_LINKS}}`, `{{TABLE_OPTIONS}}` and
/// `{{DURATION_COLUMNS}}` to fill.
const TEMPLATE: &str = include_str!("landing.html");

/// What the page may load: its own inline style and script, and requests
/// to this agent (the table browser); nothing from elsewhere.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// `<`, `>`, `&`, `"` and `'` as HTML entities.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page for the tables called `names`, in that order, showing the
/// columns called `durations` as readable durations.
pub fn render(names: &[&str], durations: &[&str]) -> String {
    let links: Vec<String> = names
        .iter()
        .map(|n| {
            let n = escape(n);
            // A long name may wrap after an underscore, not mid-word.
            let text = n.replace('_', "_<wbr>");
            format!("    <li><a href=\"/api/v1/tables/{n}\">{text}</a></li>")
        })
        .collect();
    let options: Vec<String> = names
        .iter()
        .map(|n| {
            let n = escape(n);
            format!("      <option value=\"{n}\">{n}</option>")
        })
        .collect();
    TEMPLATE
        .replace("{{TABLE_LINKS}}", &links.join("\n"))
        .replace("{{TABLE_OPTIONS}}", &options.join("\n"))
        .replace("{{DURATION_COLUMNS}}", &escape(&durations.join(",")))
}

/// `GET /`: the page for the registry's tables and the columns they
/// declare as durations (rendered once).
pub fn page() -> Resp {
    static PAGE: OnceLock<String> = OnceLock::new();
    let body = PAGE.get_or_init(|| render(&tables::names(), &tables::duration_columns()));
    let mut r = reply(StatusCode::OK, "text/html; charset=utf-8", body.as_str());
    let h = r.headers_mut();
    h.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(CSP),
    );
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_linked_and_offered() {
        let names = tables::names();
        let html = render(&names, &tables::duration_columns());
        assert!(!html.contains("{{"), "every placeholder is filled");
        for n in &names {
            assert!(
                html.contains(&format!(
                    "<a href=\"/api/v1/tables/{n}\">{}</a>",
                    n.replace('_', "_<wbr>")
                )),
                "{n}"
            );
            assert!(
                html.contains(&format!("<option value=\"{n}\">{n}</option>")),
                "{n}"
            );
        }
        for path in ["/metrics", "/healthz", "/api/v1/tables"] {
            assert!(html.contains(&format!("<a href=\"{path}\">")), "{path}");
        }
        // Self-contained: nothing loaded from elsewhere.
        for external in ["http://", "https://", "src=", "<link"] {
            assert!(!html.contains(external), "{external}");
        }
    }

    #[test]
    fn names_are_escaped() {
        let html = render(&["a<b>&\"c"], &["timer_wait", "x\"y"]);
        assert!(html.contains("<option value=\"a&lt;b&gt;&amp;&quot;c\">"));
        assert!(!html.contains("a<b>"));
        assert!(html.contains("<body data-durations=\"timer_wait,x&quot;y\">"));
    }
}
