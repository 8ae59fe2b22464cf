//! The CPU adapter's tensor: a row-major f32 matrix in host memory, whose buffer goes
//! back to the spare list when it is dropped.

use super::spare;
use crate::compute::shapes;

/// A row-major f32 matrix in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    pub(super) data: Vec<f32>,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl CpuTensor {
    pub fn values(&self) -> &[f32] {
        &self.data
    }

    pub(super) fn dims(&self) -> shapes::Dims {
        (self.rows, self.cols)
    }
}

impl Drop for CpuTensor {
    fn drop(&mut self) {
        spare::give(std::mem::take(&mut self.data));
    }
}
