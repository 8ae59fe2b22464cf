//! A config read from the tensors' shapes, for the checkpoints that come without a
//! `config.json`: ComfyUI's separate files (`clip_l.safetensors`,
//! `t5xxl_fp16.safetensors`, `ae.safetensors`) and the parts of its all-in-one
//! checkpoints. What the shapes cannot say (CLIP's heads, the VAE's groups) is the
//! value every published model of the kind has, as ComfyUI assumes it too.

use crate::families::FamilyError;
use crate::model::ModelIndex;

/// The shapes of one checkpoint, read for `what` ("a CLIP text encoder").
pub struct Shapes<'a> {
    index: &'a ModelIndex,
    what: &'static str,
}

impl<'a> Shapes<'a> {
    pub fn new(index: &'a ModelIndex, what: &'static str) -> Self {
        Self { index, what }
    }

    pub fn has(&self, name: &str) -> bool {
        self.index.tensor(name).is_some()
    }

    pub fn shape(&self, name: &str) -> Result<&'a [usize], FamilyError> {
        self.index
            .tensor(name)
            .map(|tensor| tensor.shape.as_slice())
            .ok_or_else(|| {
                let problem = format!("tensor `{name}` is missing; is this {}?", self.what);
                FamilyError::missing_tensor(&self.index.path, name, self.message(problem))
            })
    }

    /// Rows and columns of a matrix (the first two sizes of a convolution's weight).
    pub fn matrix(&self, name: &str) -> Result<(usize, usize), FamilyError> {
        match self.shape(name)? {
            [rows, cols, ..] => Ok((*rows, *cols)),
            other => {
                let problem = format!("tensor `{name}` has shape {other:?}; expected a matrix");
                let message = self.message(problem);
                // A matrix of any size: no one shape is expected.
                Err(FamilyError::tensor_shape(
                    &self.index.path,
                    name,
                    (&[], other),
                    message,
                ))
            }
        }
    }

    /// How many numbered children `prefix` has (`encoder.block.` → blocks 0..N).
    pub fn count(&self, prefix: &str) -> usize {
        self.index
            .tensors
            .iter()
            .filter_map(|tensor| {
                let rest = tensor.name.strip_prefix(prefix)?;
                rest.split('.').next()?.parse::<usize>().ok()
            })
            .max()
            .map_or(0, |largest| largest + 1)
    }

    /// The config the shapes imply is refused (no key: there is no `config.json`).
    pub fn bad(&self, problem: String) -> FamilyError {
        FamilyError::config(&self.index.path, None, self.message(problem))
    }

    /// What the shapes say is `found`, a model stagehand does not compute.
    pub fn unsupported(&self, found: &str, problem: String) -> FamilyError {
        FamilyError::unsupported(&self.index.path, found, self.message(problem))
    }

    fn message(&self, problem: String) -> String {
        format!(
            "{}: {problem} (read as {} without a config.json)",
            self.index.path.display(),
            self.what
        )
    }
}
