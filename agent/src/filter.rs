//! Layer 1: which processes a table or a setup change applies to (by
//! service name and pid).

use pfs_shm_layout::reader::SegmentSnapshot;

/// Restricts a table or a setup change to some processes.
///
/// ```
/// let f = pfs_agent::filter::Filter { service: Some("checkout".into()), pid: None };
/// assert!(f.matches("checkout", 42));
/// assert!(!f.matches("billing", 42));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this service.
    pub service: Option<String>,
    /// Only this pid.
    pub pid: Option<u32>,
}

impl Filter {
    /// True if the process `service`, `pid` passes the filter.
    pub fn matches(&self, service: &str, pid: u32) -> bool {
        self.service.as_deref().is_none_or(|x| x == service) && self.pid.is_none_or(|p| p == pid)
    }

    /// True if the segment `s` passes the filter.
    pub fn accepts(&self, s: &SegmentSnapshot) -> bool {
        self.matches(&s.service, s.pid)
    }
}

/// How a filter was asked for, to name it back in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// `--service S --pid N`: the `query` command's flags.
    Flags,
    /// `service=S&pid=N`: the HTTP API's query string.
    Query,
}

impl Filter {
    /// A warning for a filter that leaves out every process in `found`
    /// (each one's service and pid), naming what there is (at most ten);
    /// `None` if the filter asks for nothing or a process passes it. An
    /// empty answer is valid, but easy to take for "nothing happened"
    /// when a name is mistyped.
    ///
    /// ```
    /// use pfs_agent::filter::{Filter, Spelling};
    /// let f = Filter { service: Some("chekout".into()), pid: None };
    /// let found = [("checkout", 7), ("billing", 8)];
    /// assert_eq!(
    ///     f.unmatched(found, Spelling::Query).unwrap(),
    ///     r#"no segment matches service="chekout": the table is empty; services found: "billing", "checkout""#
    /// );
    /// assert_eq!(Filter::default().unmatched(found, Spelling::Flags), None);
    /// ```
    pub fn unmatched<'a>(
        &self,
        found: impl IntoIterator<Item = (&'a str, u32)>,
        spelling: Spelling,
    ) -> Option<String> {
        self.unmatched_in(found, spelling, "segment")
    }

    /// [`Filter::unmatched`] for a table of live processes only (their
    /// threads, their setup): `live` are the live processes, and a filter
    /// that matches only dead ones is said to match none of them.
    ///
    /// ```
    /// use pfs_agent::filter::{Filter, Spelling};
    /// let f = Filter { service: None, pid: Some(8) };
    /// assert_eq!(
    ///     f.unmatched_live([("checkout", 7)], Spelling::Flags).unwrap(),
    ///     r#"no live process matches --pid 8: the table is empty; processes found: "checkout" (pid 7)"#
    /// );
    /// ```
    pub fn unmatched_live<'a>(
        &self,
        live: impl IntoIterator<Item = (&'a str, u32)>,
        spelling: Spelling,
    ) -> Option<String> {
        self.unmatched_in(live, spelling, "live process")
    }

    fn unmatched_in<'a>(
        &self,
        found: impl IntoIterator<Item = (&'a str, u32)>,
        spelling: Spelling,
        among: &str,
    ) -> Option<String> {
        if self.service.is_none() && self.pid.is_none() {
            return None;
        }
        let mut names = Vec::new();
        for (service, pid) in found {
            if self.matches(service, pid) {
                return None;
            }
            names.push(match self.pid {
                Some(_) => format!("{service:?} (pid {pid})"),
                None => format!("{service:?}"),
            });
        }
        names.sort();
        names.dedup();
        let more = names.len().saturating_sub(10);
        names.truncate(10);
        let mut asked = Vec::new();
        if let Some(s) = &self.service {
            asked.push(match spelling {
                Spelling::Flags => format!("--service {s:?}"),
                Spelling::Query => format!("service={s:?}"),
            });
        }
        if let Some(p) = self.pid {
            asked.push(match spelling {
                Spelling::Flags => format!("--pid {p}"),
                Spelling::Query => format!("pid={p}"),
            });
        }
        let asked = asked.join(match spelling {
            Spelling::Flags => " ",
            Spelling::Query => "&",
        });
        let what = if self.pid.is_some() {
            "processes"
        } else {
            "services"
        };
        Some(match (names.is_empty(), more) {
            (true, _) => {
                format!("no {among} matches {asked}: the table is empty; no {among} is being read")
            }
            (false, 0) => format!(
                "no {among} matches {asked}: the table is empty; {what} found: {}",
                names.join(", ")
            ),
            (false, more) => format!(
                "no {among} matches {asked}: the table is empty; {what} found: {} and {more} more",
                names.join(", ")
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmatched_names_what_was_asked_and_what_there_is() {
        let found: Vec<(String, u32)> = (0..12).map(|i| (format!("s{i:02}"), 100 + i)).collect();
        let found = || found.iter().map(|(s, p)| (s.as_str(), *p));
        let both = Filter {
            service: Some("s01".into()),
            pid: Some(7),
        };
        assert_eq!(
            both.unmatched(found(), Spelling::Flags).unwrap(),
            "no segment matches --service \"s01\" --pid 7: the table is empty; processes found: \
             \"s00\" (pid 100), \"s01\" (pid 101), \"s02\" (pid 102), \"s03\" (pid 103), \
             \"s04\" (pid 104), \"s05\" (pid 105), \"s06\" (pid 106), \"s07\" (pid 107), \
             \"s08\" (pid 108), \"s09\" (pid 109) and 2 more"
        );
        let pid = Filter {
            service: None,
            pid: Some(111),
        };
        assert_eq!(pid.unmatched(found(), Spelling::Query), None);
        assert_eq!(
            both.unmatched([], Spelling::Query).unwrap(),
            "no segment matches service=\"s01\"&pid=7: the table is empty; no segment is being read"
        );
    }
}
