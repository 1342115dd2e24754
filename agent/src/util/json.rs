//! The head every file the agent writes in JSON starts with: its format
//! and version, read before the rest, whose shape may differ from one
//! version to another.

use serde::Deserialize;

/// A JSON file's `format` and `version` fields (the others ignored).
#[derive(Debug, Deserialize)]
pub struct FileHead {
    /// What kind of file it is.
    pub format: String,
    /// The version of its shape.
    pub version: u32,
}
