//! Host bytes a block can be computed from where they are: a model file's cached pages,
//! mapped, shared read-only by whoever holds a clone.

use std::sync::Arc;

/// Host bytes that stay allocated and unchanged while any clone is alive.
#[derive(Clone)]
pub struct SharedBytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl SharedBytes {
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        Self(owner)
    }

    pub fn as_slice(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "SharedBytes({} bytes)", self.as_slice().len())
    }
}
