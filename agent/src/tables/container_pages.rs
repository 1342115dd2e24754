//! `container_pages`: each page of the thread container, its state, the
//! records in use and the memory it holds.

use pfs_shm_layout::container::PageState;

use super::cell::Sink;
use super::columns::{head, with_head};
use super::view::{PfsTable, View};

/// The `container_pages` table.
#[derive(Debug)]
pub struct ContainerPages;

impl PfsTable for ContainerPages {
    fn name(&self) -> &str {
        "container_pages"
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&[
            "container",
            "page",
            "state",
            "records",
            "records_used",
            "bytes",
        ]));
        for (_, s) in &view.segments {
            let rpp = s.geometry.records_per_page;
            let mut used = vec![0u64; s.page_states.len()];
            for t in &s.threads {
                if let Some(u) = used.get_mut((t.record / rpp) as usize) {
                    *u += 1;
                }
            }
            for (page, state) in s.page_states.iter().enumerate() {
                let resident = *state == PageState::Active;
                let mut r = head(s);
                r.extend([
                    "threads".into(),
                    page.into(),
                    state.name().to_uppercase().into(),
                    rpp.into(),
                    used[page].into(),
                    (if resident { s.geometry.page_size } else { 0 }).into(),
                ]);
                sink.row(&r);
            }
        }
    }
}
