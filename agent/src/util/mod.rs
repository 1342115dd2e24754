//! Layer 0: small helpers every other module may use and that know nothing
//! of segments: files opened without following links, atomic writes,
//! capped reads, sizes and durations as the command line writes them,
//! giving freed heap memory back to the kernel, the head of the agent's
//! JSON files, text shown to a person with its control characters
//! escaped, and the machine's host name.

pub mod fs;
pub mod heap;
pub mod host;
pub mod json;
pub mod shown;
pub mod text;
