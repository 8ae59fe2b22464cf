//! Host bytes a block can be computed from where they are: a model file's cached pages,
//! mapped, shared read-only by whoever holds a clone.

use std::sync::Arc;

/// A range of host bytes that stays allocated and unchanged while any clone is alive.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    length: usize,
}

impl SharedBytes {
    /// `start .. start + length` of `owner`'s bytes; `None` when the range reaches past
    /// them.
    pub fn new(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        length: usize,
    ) -> Option<Self> {
        let end = start.checked_add(length)?;
        ((*owner).as_ref().len() >= end).then_some(Self {
            owner,
            start,
            length,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.length]
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "SharedBytes({} bytes)", self.length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_the_owners_bytes_and_one_past_them_is_refused() {
        // Proves the range reads the owner's own bytes and that a range reaching past
        // them (or overflowing) is no range at all.
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![1u8, 2, 3, 4, 5]);
        let bytes = SharedBytes::new(Arc::clone(&owner), 1, 3).expect("inside");
        assert_eq!(bytes.as_slice(), &[2, 3, 4]);
        assert!(SharedBytes::new(Arc::clone(&owner), 3, 3).is_none());
        assert!(SharedBytes::new(owner, usize::MAX, 2).is_none());
    }
}
