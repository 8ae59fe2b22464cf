//! The safetensors model index: which tensors a checkpoint holds, where their bytes
//! live, and how they group into the blocks the scheduler moves. Also the generator of
//! the linear-stack demo model.

mod blocks;
pub mod cache;
mod checksum;
pub mod demo;
pub mod demo_moe;
mod error;
pub mod folder;
mod folder_kind;
pub mod generated;
mod header;
mod index;
mod known_checksums;
mod part;
mod reader;
mod source;
mod wan_names;
mod wan_vae_names;

pub use crate::os::{create_regular, open_regular, read_regular, FileStamp};
pub use checksum::{
    checksum_text, verify_data_checksum, ChecksumError, DataChecksum, GeneratedWriter,
    DATA_CHECKSUM_KEY, PENDING_CHECKSUM,
};
pub use error::{FolderPart, IndexError};
pub use folder::{read_json, FolderError, ModelFolder};
pub use header::MAX_HEADER_BYTES;
pub use index::{BlockInfo, ModelIndex, ShardFile, TensorInfo};
pub use known_checksums::KnownChecksums;
pub use part::{CheckpointPart, PartNames};
pub use reader::{BlockReadError, BlockReader};
pub use source::{parse_index, ParsedIndex};
pub(crate) use wan_names::diffusers_to_wan;
