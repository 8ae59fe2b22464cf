//! The landing check's expected checksums, kept between runs: each block's checksum as
//! read from the model's files, valid while every file of the model keeps the stamp
//! (device, inode, length, modification and change times) it had when it was summed.
//! A repeated run on the same checkpoint then checks its landings without reading the
//! checkpoint from the disk a second time (MiniLM: 40 ms of its 1.3 s `embed`; the pin
//! manager drops a pinned block's pages, so that read always went to the disk).
//!
//! A cached checksum only saves a read: a landing that differs from it is checked
//! again against the file itself before it is called corrupt (see
//! `families/landing.rs`), so a stale or damaged cache can cost time, never a wrong
//! verdict.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use stagehand_actors::Extent;

use super::ModelIndex;
use crate::compute::checksum::checksum;
use crate::os::FileStamp;

/// Cache files kept in the cache directory at most; the oldest go first (every model a
/// test suite writes to a temporary folder leaves one).
const KEPT_FILES: usize = 64;

/// Bytes whose checksum tells a cache written under another checksum definition apart.
const DEFINITION_PROBE: &[u8] = b"stagehand landing checksum";

/// Expected checksums of a model's blocks, loaded from and saved to one cache file.
#[derive(Debug)]
pub struct KnownChecksums {
    /// `None`: the model's files have no stamps, nothing is cached.
    path: Option<PathBuf>,
    cached: CacheFile,
    /// Entries learned since the cache was read.
    learned: usize,
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
struct CacheFile {
    /// The checksum of [`DEFINITION_PROBE`] when these were summed.
    definition: u64,
    /// Every file of the model, in index order, as it was summed.
    files: Vec<(PathBuf, FileStamp)>,
    /// Checksum by block extents ([`key`]).
    blocks: BTreeMap<String, u64>,
}

impl KnownChecksums {
    /// None known and none to be saved.
    pub fn none() -> Self {
        Self {
            path: None,
            cached: CacheFile::default(),
            learned: 0,
        }
    }

    /// The checksums cached in `cache_dir` for `index`'s files as they are now; none if
    /// the cache is missing, unreadable, from another checksum definition, or any file
    /// changed since.
    pub fn open(cache_dir: &Path, index: &ModelIndex) -> Self {
        let Some(files) = index
            .files
            .iter()
            .map(|file| Some((file.path.clone(), file.stamp?)))
            .collect::<Option<Vec<_>>>()
        else {
            return Self::none();
        };
        let path = Self::cache_file(cache_dir, index);
        let fresh = CacheFile {
            definition: checksum(DEFINITION_PROBE),
            files,
            blocks: BTreeMap::new(),
        };
        let cached = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<CacheFile>(&bytes).ok())
            .filter(|cached| cached.definition == fresh.definition && cached.files == fresh.files)
            .unwrap_or(fresh);
        Self {
            path: Some(path),
            cached,
            learned: 0,
        }
    }

    /// Where the checksums of `index`'s model are kept in `cache_dir`: one file a
    /// model, wherever it is opened from.
    pub fn cache_file(cache_dir: &Path, index: &ModelIndex) -> PathBuf {
        let model = std::fs::canonicalize(&index.path).unwrap_or_else(|_| index.path.clone());
        cache_dir.join("checksums").join(format!(
            "{:016x}.json",
            checksum(model.as_os_str().as_encoded_bytes())
        ))
    }

    /// The cached checksum of the bytes of `extents` laid end to end.
    pub fn get(&self, extents: &[Extent]) -> Option<u64> {
        self.cached.blocks.get(&key(extents)).copied()
    }

    /// Keeps the checksum of `extents` read from the files.
    pub fn learn(&mut self, extents: &[Extent], sum: u64) {
        if self.path.is_some() && self.cached.blocks.insert(key(extents), sum) != Some(sum) {
            self.learned += 1;
        }
    }

    /// Writes what was learned back to the cache (atomically; a cache that cannot be
    /// written is only noted, as the roofline's is).
    pub fn save(&self) {
        let Some(path) = self.path.as_ref().filter(|_| self.learned > 0) else {
            return;
        };
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                let text = serde_json::to_vec(&self.cached).unwrap_or_default();
                crate::os::write_atomically(path, |mut file| file.write_all(&text))
            });
        match written {
            Ok(()) => remove_oldest(path.parent().unwrap_or(Path::new(".")), KEPT_FILES),
            Err(error) => {
                tracing::debug!("checksums not cached at {}: {error}", path.display())
            }
        }
    }
}

/// A block's extents as one cache key: `file:offset+length` joined by `,`.
fn key(extents: &[Extent]) -> String {
    let parts: Vec<String> = extents
        .iter()
        .map(|extent| format!("{}:{}+{}", extent.file.0, extent.offset, extent.length))
        .collect();
    parts.join(",")
}

/// Removes the least recently written cache files (`*.json`) of `dir` beyond `kept`.
fn remove_oldest(dir: &Path, kept: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .path()
                .extension()
                .is_some_and(|extension| extension == "json")
        })
        .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
        .collect();
    if files.len() <= kept {
        return;
    }
    files.sort();
    for (_, path) in &files[..files.len() - kept] {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stagehand_actors::FileId;

    /// A one-tensor checkpoint at `path`, indexed.
    fn checkpoint(path: &Path, byte: u8) -> ModelIndex {
        let data = vec![byte; 4096];
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4096], &data)
            .expect("tensor");
        safetensors::serialize_to_file([("layers.0.w", view)], None, path).expect("written");
        ModelIndex::open(path, None).expect("indexed")
    }

    fn extents() -> Vec<Extent> {
        vec![Extent {
            file: FileId(0),
            offset: 64,
            length: 4096,
        }]
    }

    #[test]
    fn kept_checksums_hold_until_a_file_of_the_model_changes() {
        // Proves a checksum learned and saved is found by the next open of the same
        // files, and not once the file was rewritten (same bytes: the stamp changes).
        let dir = tempfile::tempdir().expect("temp dir");
        let (cache, model) = (dir.path().join("cache"), dir.path().join("m.safetensors"));
        let index = checkpoint(&model, 1);
        let mut known = KnownChecksums::open(&cache, &index);
        assert_eq!(known.get(&extents()), None);
        known.learn(&extents(), 42);
        known.save();
        assert_eq!(
            KnownChecksums::open(&cache, &index).get(&extents()),
            Some(42)
        );
        // File times tick at the kernel's coarse clock (a jiffy: up to 10 ms).
        std::thread::sleep(std::time::Duration::from_millis(50));
        let rewritten = checkpoint(&model, 1);
        assert_eq!(
            KnownChecksums::open(&cache, &rewritten).get(&extents()),
            None
        );
    }

    #[test]
    fn a_cache_written_under_another_checksum_definition_is_not_read() {
        // Proves the definition probe: a cache whose probe differs (the checksum's
        // definition changed since it was written) gives no checksum.
        let dir = tempfile::tempdir().expect("temp dir");
        let (cache, model) = (dir.path().join("cache"), dir.path().join("m.safetensors"));
        let index = checkpoint(&model, 2);
        let mut known = KnownChecksums::open(&cache, &index);
        known.learn(&extents(), 7);
        known.save();
        let path = KnownChecksums::cache_file(&cache, &index);
        let mut file: CacheFile = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        file.definition ^= 1;
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        assert_eq!(KnownChecksums::open(&cache, &index).get(&extents()), None);
    }

    #[test]
    fn the_cache_folder_keeps_a_bounded_number_of_files() {
        // Proves every model a test suite writes to a temporary folder does not leave
        // a cache file for ever: past the bound the oldest go, other files stay.
        let dir = tempfile::tempdir().expect("temp dir");
        for file in 0..KEPT_FILES + 5 {
            std::fs::write(dir.path().join(format!("{file}.json")), b"{}").unwrap();
        }
        std::fs::write(dir.path().join(".pending.tmp"), b"").unwrap();
        remove_oldest(dir.path(), KEPT_FILES);
        let left = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(left, KEPT_FILES + 1);
        assert!(dir.path().join(".pending.tmp").exists());
    }
}
