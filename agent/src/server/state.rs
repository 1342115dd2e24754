//! What every request of one server shares: the snapshot source, the
//! `/metrics` cache, the tokens and the `TRUNCATE` baselines.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use super::auth::Tokens;
use super::metrics_cache::MetricsCache;
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
    baselines: Mutex<Baselines>,
    /// Where the TRUNCATE baselines are saved.
    pub(super) baselines_dir: Option<PathBuf>,
}

/// Options of the server beyond its snapshot source.
#[derive(Debug, Default)]
pub struct AppOptions {
    /// The bearer tokens.
    pub tokens: Tokens,
    /// Directory (the segment directory) where `TRUNCATE` baselines are
    /// kept across restarts (none: in memory only).
    pub baselines_dir: Option<PathBuf>,
    /// The agent's own figures, shared with the OTLP exporter (none: the
    /// server's own).
    pub stats: Option<Arc<AgentStats>>,
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
            .map(Baselines::load)
            .unwrap_or_default();
        Arc::new(Self {
            metrics: MetricsCache::new(snap.clone(), stats.clone()),
            snap,
            stats,
            tokens: o.tokens,
            baselines: Mutex::new(baselines),
            baselines_dir: o.baselines_dir,
        })
    }

    /// The `TRUNCATE` baselines.
    pub(super) fn baselines(&self) -> MutexGuard<'_, Baselines> {
        self.baselines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Renders `/metrics` as text (see [`MetricsCache::render`]).
    pub fn metrics(&self) -> Result<bytes::Bytes, crate::export::prometheus::RenderError> {
        self.metrics
            .render(crate::export::prometheus::Exposition::Text)
    }
}
