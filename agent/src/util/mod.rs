//! Layer 0: small helpers every other module may use and that know nothing
//! of segments: files opened without following links, atomic writes,
//! capped reads, sizes and durations as the command line writes them, and
//! giving freed heap memory back to the kernel.

pub mod fs;
pub mod heap;
pub mod text;
