//! Placeholder module, filled in by its owner.
pub mod cuda;
