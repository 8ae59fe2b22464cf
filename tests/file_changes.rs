//! Files that change under `stagehand`: a header truncated while it is read is an
//! error, never a SIGBUS (headers are read with pread, not mapped); a model rewritten,
//! truncated or replaced after it was indexed is refused at the next block read or
//! before the run opens it, not steps later.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use stagehand::actors::ResidencyPolicy;
use stagehand::model::{BlockReader, ModelIndex};
use stagehand::run::{execute, no_observer, prepare, Budgets, RunPlan, WorkloadKind};
use stagehand::settings::Settings;

/// A file with a large header (so reading it takes a while) and one byte per tensor.
fn large_header_file(path: &Path) -> Vec<u8> {
    let mut header = String::from("{");
    let tensors = 40_000;
    for tensor in 0..tensors {
        if tensor > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"layers.{tensor}.w\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[{tensor},{}]}}",
            tensor + 1
        ));
    }
    header.push('}');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + tensors, 1);
    std::fs::write(path, &bytes).expect("written");
    bytes
}

/// Index attempts against the racing writer: each reads a 1.6 MB header.
const ATTEMPTS: usize = 40;

#[test]
fn a_header_truncated_while_it_is_read_is_an_error_never_a_signal() {
    // Proves indexing races a writer that keeps truncating and restoring the file
    // without ever being killed by SIGBUS (a mapped header faulted here): every open
    // either indexes the whole file or reports an error naming it.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("racing.safetensors");
    let bytes = large_header_file(&path);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let path = path.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("writable");
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                file.set_len(16).expect("truncated");
                file.set_len(bytes.len() as u64).expect("extended");
                file.write_all_at(&bytes, 0).expect("restored");
                rounds += 1;
            }
            rounds
        })
    };
    let (mut indexed, mut refused) = (0, 0);
    for _ in 0..ATTEMPTS {
        match ModelIndex::open(&path, None) {
            Ok(index) => {
                assert_eq!(index.tensors.len(), 40_000);
                indexed += 1;
            }
            Err(error) => {
                assert!(error.to_string().contains("racing.safetensors"), "{error}");
                refused += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().expect("writer");
    assert!(rounds > 0 && indexed + refused == ATTEMPTS);
}

#[test]
fn a_model_rewritten_truncated_or_replaced_after_indexing_is_refused() {
    // Proves each kind of change after the index was built is named by
    // `check_unchanged`, which a run calls before it opens the files.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let index = ModelIndex::open(&model, None).expect("indexes");
    index.check_unchanged().expect("untouched");

    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .expect("open");
    file.write_all_at(&[0u8; 4], index.files[0].header_bytes)
        .expect("rewritten in place");
    let error = index.check_unchanged().expect_err("rewritten");
    assert!(error.to_string().contains("written to"), "{error}");

    let index = ModelIndex::open(&model, None).expect("indexes again");
    file.set_len(index.files[0].bytes - 8).expect("truncated");
    let error = index.check_unchanged().expect_err("truncated");
    assert!(error.to_string().contains("length"), "{error}");

    let fresh = dir.path().join("fresh");
    let replacement = common::demo::small_demo_model(&fresh);
    let index = ModelIndex::open(&replacement, None).expect("indexes");
    std::fs::copy(&replacement, dir.path().join("copy.safetensors")).expect("copied");
    std::fs::rename(dir.path().join("copy.safetensors"), &replacement).expect("replaced");
    let error = index.check_unchanged().expect_err("replaced");
    assert!(error.to_string().contains("replaced"), "{error}");
}

#[test]
fn a_model_truncated_while_its_reference_is_read_fails_at_the_next_block() {
    // Proves the reads a reference is computed from notice a truncation at the very
    // next block, with a message saying the file changed.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let index = ModelIndex::open(&model, None).expect("indexes");
    let reader = BlockReader::open(&index).expect("opens");
    reader.read(0).expect("block 0 before the change");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .expect("open");
    file.set_len(index.files[0].bytes / 2).expect("truncated");
    let error = reader.read(1).expect_err("block 1 after the change");
    assert!(
        error
            .to_string()
            .contains("changed while it was being read"),
        "{error}"
    );
}

#[test]
fn a_model_changed_after_its_reference_was_computed_fails_before_any_step() {
    // Proves a run whose model was overwritten between preparing (the reference read)
    // and streaming fails at start, naming the file, with no step run.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let settings = Settings::default();
    let prepared = prepare(&model, WorkloadKind::Auto, 4, &settings, true).expect("prepares");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .expect("open");
    file.write_all_at(&[0u8; 8], prepared.index.files[0].header_bytes)
        .expect("overwritten");
    let steps = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = steps.clone();
    let plan = RunPlan {
        settings: &settings,
        budgets: Budgets {
            vram_budget_bytes: 2560 * 1024,
            pin_ceiling_bytes: 2048 * 1024,
        },
        prefetch_depth: 2,
        policy: ResidencyPolicy::Planned,
        steps: 3,
        stop: Arc::new(AtomicBool::new(false)),
        observer: no_observer(),
        on_step: Box::new(move |_, _| {
            counted.fetch_add(1, Ordering::Relaxed);
        }),
        fail_after_reads: None,
        keep_outputs: false,
        on_token: None,
        measure_links: false,
        shared: None,
    };
    let Err(error) = execute(&prepared, plan) else {
        panic!("a changed model must not run");
    };
    assert!(error.to_string().contains("changed"), "{error}");
    assert_eq!(steps.load(Ordering::Relaxed), 0);
}
