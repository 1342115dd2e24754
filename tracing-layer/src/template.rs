//! Layer 0. Templates: the little language the rules name classes and
//! write `SQL_TEXT` and `DIGEST` texts with. `"{method} {route|matched_path}"`
//! is literal text with placeholders; a placeholder names one field, or
//! several separated by `|` (the first one the span has a value for wins);
//! `{{` and `}}` are literal braces. Field names are interned in a table
//! shared by all the templates of one rule, so that a span keeps one value
//! per field however many templates use it.

use std::fmt;

/// Why a template could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    template: String,
    reason: &'static str,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad template {:?}: {}", self.template, self.reason)
    }
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// Literal text.
    Lit(String),
    /// A placeholder: indices in the rule's field table, first present wins.
    Field(Vec<usize>),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Parses `text`, interning the field names it refers to in `names`.
    pub(crate) fn parse(text: &str, names: &mut Vec<String>) -> Result<Self, TemplateError> {
        let err = |reason| TemplateError {
            template: text.to_string(),
            reason,
        };
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '}' => return Err(err("unmatched `}` (write `}}` for a literal brace)")),
                '{' => {
                    let mut inner = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some('{') => return Err(err("`{` inside a placeholder")),
                            Some(c) => inner.push(c),
                            None => return Err(err("unclosed `{`")),
                        }
                    }
                    let mut alts = Vec::new();
                    for name in inner.split('|').map(str::trim) {
                        if name.is_empty() {
                            return Err(err("empty field name in a placeholder"));
                        }
                        alts.push(intern(names, name));
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Field(alts));
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Self { parts })
    }

    /// True if the template has no placeholder: it renders to one text.
    pub(crate) fn is_static(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// Appends the rendering to `out`, each placeholder replaced by the
    /// first of its fields `value` has a value for. A placeholder with no
    /// value is rendered as `missing` if given; without, rendering stops
    /// and returns false (`out` then holds a partial text).
    pub(crate) fn render<'v>(
        &self,
        value: impl Fn(usize) -> Option<&'v str>,
        missing: Option<&str>,
        out: &mut String,
    ) -> bool {
        for part in &self.parts {
            match part {
                Part::Lit(s) => out.push_str(s),
                Part::Field(alts) => match alts.iter().find_map(|&i| value(i)) {
                    Some(v) => out.push_str(v),
                    None => match missing {
                        Some(m) => out.push_str(m),
                        None => return false,
                    },
                },
            }
        }
        true
    }

    /// Whether [`Template::render`] without `missing` would succeed and
    /// append exactly `text`: a comparison, nothing written.
    pub(crate) fn renders_as<'v>(
        &self,
        value: impl Fn(usize) -> Option<&'v str>,
        text: &str,
    ) -> bool {
        let mut rest = text.as_bytes();
        for part in &self.parts {
            let piece = match part {
                Part::Lit(s) => s.as_str(),
                Part::Field(alts) => match alts.iter().find_map(|&i| value(i)) {
                    Some(v) => v,
                    None => return false,
                },
            };
            match rest.strip_prefix(piece.as_bytes()) {
                Some(r) => rest = r,
                None => return false,
            }
        }
        rest.is_empty()
    }
}

/// The index of `name` in `names`, added if new.
fn intern(names: &mut Vec<String>, name: &str) -> usize {
    match names.iter().position(|n| n == name) {
        Some(i) => i,
        None => {
            names.push(name.to_string());
            names.len() - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(
        t: &Template,
        names: &[String],
        vals: &[(&str, &str)],
        missing: Option<&str>,
    ) -> Option<String> {
        let mut out = String::new();
        let value = |i: usize| vals.iter().find(|(n, _)| *n == names[i]).map(|(_, v)| *v);
        t.render(value, missing, &mut out).then_some(out)
    }

    #[test]
    fn placeholders_alternatives_and_braces() {
        let mut names = Vec::new();
        let t = Template::parse("{method} {route | matched_path} {{x}}", &mut names).unwrap();
        assert_eq!(names, ["method", "route", "matched_path"]);
        assert!(!t.is_static());
        let r = render(
            &t,
            &names,
            &[("method", "GET"), ("matched_path", "/u/{id}")],
            None,
        );
        assert_eq!(r.as_deref(), Some("GET /u/{id} {x}"));
        let r = render(
            &t,
            &names,
            &[("method", "GET"), ("route", "/a"), ("matched_path", "/b")],
            None,
        );
        assert_eq!(r.as_deref(), Some("GET /a {x}"));
        let vals = [("method", "GET"), ("route", "/a")];
        let value = |i: usize| vals.iter().find(|(n, _)| *n == names[i]).map(|(_, v)| *v);
        assert!(t.renders_as(value, "GET /a {x}"));
        for other in ["GET /a {x}!", "GET /a {x", "GET /b {x}", ""] {
            assert!(!t.renders_as(value, other), "{other}");
        }
        assert!(
            !t.renders_as(|_| None, " {x}"),
            "a missing value never matches"
        );
        assert_eq!(render(&t, &names, &[("method", "GET")], None), None);
        let r = render(&t, &names, &[("method", "GET")], Some("?"));
        assert_eq!(r.as_deref(), Some("GET ? {x}"));
        // A second template shares the table.
        let t2 = Template::parse("{uri}:{method}", &mut names).unwrap();
        assert_eq!(names, ["method", "route", "matched_path", "uri"]);
        let r = render(&t2, &names, &[("method", "PUT"), ("uri", "/x?y")], None);
        assert_eq!(r.as_deref(), Some("/x?y:PUT"));
        assert!(Template::parse("fixed", &mut names).unwrap().is_static());
    }

    #[test]
    fn malformed_templates_are_refused() {
        let mut names = Vec::new();
        for bad in ["{a", "a}", "{}", "{a|}", "{a{b}}"] {
            let e = Template::parse(bad, &mut names).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
