//! What every request of one server shares: the snapshot source, the
//! `/metrics` cache, the tokens, the `Host` check, the `TRUNCATE`
//! baselines, the table streams' slots and what `/healthz` checks.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::auth::Tokens;
use super::metrics_cache::MetricsCache;
use super::rebinding::HostCheck;
use super::stream::TableStreams;
use crate::export::model::AgentStats;
use crate::snapshot::Snapshotter;
use crate::truncate::Baselines;

/// Shared state of the server.
#[derive(Debug)]
pub struct AppState {
    /// The snapshot source.
    pub snap: Arc<Snapshotter>,
    /// The agent's own figures (scrape time, OTLP exports).
    pub stats: Arc<AgentStats>,
    pub(super) metrics: MetricsCache,
    pub(super) tokens: Tokens,
    pub(super) host_check: HostCheck,
    baselines: Mutex<Baselines>,
    /// Where the TRUNCATE baselines are saved.
    pub(super) baselines_dir: Option<PathBuf>,
    /// The table streams' slots.
    pub(super) table_streams: TableStreams,
    /// See [`AppOptions::discovery_stale_after`].
    pub(super) discovery_stale_after: Option<Duration>,
}

/// Options of the server beyond its snapshot source.
#[derive(Debug, Default)]
pub struct AppOptions {
    /// The bearer tokens.
    pub tokens: Tokens,
    /// Which `Host` headers a loopback connection may send (DNS rebinding).
    pub host_check: HostCheck,
    /// Directory (the segment directory) where `TRUNCATE` baselines are
    /// kept across restarts (none: in memory only).
    pub baselines_dir: Option<PathBuf>,
    /// Read only a baselines file this agent's user owns (under
    /// `--require-owner`: [`crate::segments::SegmentSet::own_files_only`]).
    pub baselines_own_files_only: bool,
    /// The agent's own figures, shared with the OTLP exporter (none: the
    /// server's own).
    pub stats: Option<Arc<AgentStats>>,
    /// `/healthz` answers 503 once the snapshotter's last background
    /// discovery pass ([`Snapshotter::since_refresh`]) is older than this:
    /// set it when something refreshes the snapshotter in the background
    /// (`serve` does, every second). None: `/healthz` always answers `ok`.
    pub discovery_stale_after: Option<Duration>,
}

impl AppState {
    /// State over `snap`; `control_token` enables the control endpoints.
    pub fn new(snap: Arc<Snapshotter>, control_token: Option<String>) -> Arc<Self> {
        Self::with_options(
            snap,
            AppOptions {
                tokens: Tokens {
                    control: control_token,
                    read: None,
                },
                ..AppOptions::default()
            },
        )
    }

    /// State over `snap` with `o` (loads saved `TRUNCATE` baselines).
    pub fn with_options(snap: Arc<Snapshotter>, o: AppOptions) -> Arc<Self> {
        let stats = o.stats.unwrap_or_default();
        let baselines = o
            .baselines_dir
            .as_deref()
            .map(|d| Baselines::load(d, o.baselines_own_files_only))
            .unwrap_or_default();
        Arc::new(Self {
            metrics: MetricsCache::new(snap.clone(), stats.clone()),
            snap,
            stats,
            tokens: o.tokens,
            host_check: o.host_check,
            baselines: Mutex::new(baselines),
            baselines_dir: o.baselines_dir,
            table_streams: TableStreams::default(),
            discovery_stale_after: o.discovery_stale_after,
        })
    }

    /// The `TRUNCATE` baselines.
    pub(super) fn baselines(&self) -> MutexGuard<'_, Baselines> {
        self.baselines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the agent is unhealthy, if it is: its background discovery has
    /// not completed a pass for longer than
    /// [`AppOptions::discovery_stale_after`] (a pass stuck on a hung
    /// filesystem, or the discovery thread gone: dead processes then go
    /// unnoticed and `/metrics` may hang). `/healthz` says so with 503,
    /// and a restart is what helps.
    pub fn unhealthy(&self) -> Option<String> {
        let limit = self.discovery_stale_after?;
        let since = self.snap.since_refresh();
        (since > limit).then(|| {
            format!(
                "unhealthy: the segment discovery has not completed a pass for {:.1} s \
                 (limit {} s): the agent is stuck (a hung filesystem under --shm-dir?) \
                 and needs a restart\n",
                since.as_secs_f64(),
                limit.as_secs()
            )
        })
    }

    /// What is wrong that a restart does not fix, if anything, a
    /// `degraded:` line each (see [`Snapshotter::problems`]): the segment
    /// directory cannot be listed (no process can be found; a directory
    /// not created yet is not a failure), segment files the agent may not
    /// read, retired totals that cannot be saved, a full volume.
    /// `/healthz` still answers 200, with these lines after `ok`: a
    /// failing probe would restart the agent in a loop, and a native
    /// sidecar's failing startup probe would keep the application from
    /// starting. Each is also counted in a metric and logged.
    pub fn degraded(&self) -> Option<String> {
        let problems = self.snap.problems();
        (!problems.is_empty()).then(|| {
            problems
                .iter()
                .map(|p| format!("degraded: {p}\n"))
                .collect()
        })
    }

    /// Renders `/metrics` as text (see [`MetricsCache::render`]).
    pub fn metrics(&self) -> Result<bytes::Bytes, crate::export::prometheus::RenderError> {
        self.metrics
            .render(crate::export::prometheus::Exposition::Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segments::SegmentSet;

    fn state(dir: &std::path::Path) -> Arc<AppState> {
        let set = SegmentSet::new(dir, Duration::from_secs(60));
        AppState::new(Arc::new(Snapshotter::new(set, Duration::ZERO)), None)
    }

    /// A segment directory that cannot be listed makes the agent
    /// degraded (not unhealthy: a restart does not help), with the reason
    /// and what to do; one not created yet does not.
    #[test]
    fn a_directory_that_cannot_be_listed_is_degraded_a_missing_one_is_not() {
        let root = tempfile::tempdir().unwrap();
        let missing = state(&root.path().join("later"));
        missing.snap.refresh();
        assert_eq!(missing.degraded(), None);
        let file = root.path().join("afile");
        std::fs::write(&file, b"").unwrap();
        let s = state(&file);
        assert_eq!(s.degraded(), None, "no pass yet");
        s.snap.refresh();
        assert_eq!(s.unhealthy(), None, "a restart would not help");
        let why = s.degraded().expect("degraded");
        assert!(
            why.contains("cannot list the segment directory")
                && why.contains(&file.display().to_string())
                && why.contains("--shm-dir"),
            "{why}"
        );
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        s.snap.refresh();
        assert_eq!(s.degraded(), None, "fine again once listed");
    }
}
