//! The expert hand-over of the tiny Wan 2.2 A14B-shaped pipeline
//! (tests/fixtures/wan_pipeline): the second expert's first blocks loaded during the
//! first expert's last step inside one budget, and a stop at the switch giving back
//! every byte of both.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use stagehand::pipeline::{generate_video, PipelineError, PipelineRun, VideoRequest, WanParts};
use stagehand::run::RunError;
use stagehand::settings::Settings;

use common::usage::LastUsage;
use common::wan::{assemble, reference_request};

#[test]
fn a_video_stopped_at_the_hand_over_gives_back_every_byte() {
    // Proves a stop at the switch between the experts — as the first expert's last
    // step begins (the second opening beside it), as it ends, as the second begins,
    // after the second's first step — ends the
    // pipeline Cancelled in the stage it reached, every budget of both experts given
    // back (the last usage either tier reported is 0 B), and no later stage run.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let parts = WanParts::folder(&assemble(dir.path())).expect("a Wan pipeline");
    let settings = Settings::default();
    let moments = [
        // As the first expert's last step begins: the second opens beside it, in
        // the one budget, and waits for its start.
        ("transformer", 1, "transformer"),
        ("transformer", 2, "transformer"),
        ("transformer_2", 0, "transformer_2"),
        ("transformer_2", 1, "transformer_2"),
    ];
    for (at, done, cancelled_in) in moments {
        let usage = Arc::new(LastUsage::default());
        let stop = Arc::new(AtomicBool::new(false));
        let raise = Arc::clone(&stop);
        let ran = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stages = Arc::clone(&ran);
        let run = PipelineRun {
            observer: usage.clone(),
            progress: Arc::new(move |stage, step, _| {
                stages.lock().expect("not poisoned").push(stage);
                if (stage, step) == (at, done) {
                    raise.store(true, Ordering::SeqCst);
                }
            }),
            stop,
            ..PipelineRun::quiet(&settings)
        };
        let what = format!("stopped at {at} step {done}");
        let Err(error) = generate_video(&parts, &reference_request(), &run) else {
            panic!("{what}: the video was made");
        };
        match &error {
            PipelineError::Stage {
                stage,
                source: RunError::Cancelled { .. },
            } => assert_eq!(*stage, cancelled_in, "{what}"),
            other => panic!("{what}: not cancelled: {other}"),
        }
        let ran = ran.lock().expect("not poisoned");
        assert!(!ran.contains(&"vae"), "{what}: the VAE ran: {ran:?}");
        assert_eq!(usage.vram.load(Ordering::SeqCst), 0, "{what}: VRAM held");
        assert_eq!(
            usage.pinned.load(Ordering::SeqCst),
            0,
            "{what}: pinned held"
        );
    }
}

#[test]
fn the_second_experts_first_blocks_load_during_the_first_experts_last_step() {
    // Proves the hand-over's prefetch in one budget: the video is bit for bit the one
    // made without the prefetch; the second expert's blocks reached VRAM before its
    // first step; while both were open they held together at most the one budget;
    // after the run neither tier holds a byte; and in a budget short of two floors
    // the second opens after the first, the video the same. (On these fixtures a
    // floor — the ring and a step's activations, 1.32 MiB — is larger than an
    // expert's weights, 76 KiB, so a budget that holds two floors holds both experts
    // whole: the budget cannot be below one expert here.)
    let dir = tempfile::tempdir().expect("a temporary folder");
    let parts = WanParts::folder(&assemble(dir.path())).expect("a Wan pipeline");
    let made = |vram_budget: u64, hand_over_prefetch: bool| {
        let settings = Settings {
            vram_budget: Some(bytesize::ByteSize::b(vram_budget)),
            ..Settings::default()
        };
        let usage = Arc::new(LastUsage::default());
        let run = PipelineRun {
            observer: usage.clone(),
            ..PipelineRun::quiet(&settings)
        };
        let request = VideoRequest {
            hand_over_prefetch,
            ..reference_request()
        };
        let video = generate_video(&parts, &request, &run).expect("makes a video");
        assert_eq!(usage.vram.load(Ordering::SeqCst), 0, "VRAM held");
        assert_eq!(usage.pinned.load(Ordering::SeqCst), 0, "pinned held");
        video
    };
    // A budget with room for both to the full: each expert's floor, measured.
    let roomy = made(64 << 20, true);
    let floor = (roomy.hand_over.as_ref())
        .and_then(|hand_over| hand_over.both_open)
        .expect("the second opened beside the first")
        .expert_floor_vram_bytes;
    let expert_bytes = roomy.stages[1].outcome.model_bytes;
    // Two floors and half an expert's weights.
    let budget = 2 * floor + expert_bytes / 2;
    let (with, without) = (made(budget, true), made(budget, false));
    assert_eq!(with.latent, without.latent, "the latent differs");
    for (a, b) in with.frames.iter().zip(&without.frames) {
        assert_eq!(a.values, b.values, "a frame differs");
    }
    let hand_over = with.hand_over.as_ref().expect("a hand-over");
    eprintln!("wan pipeline, prefetched: {hand_over:?}");
    eprintln!("wan pipeline, not prefetched: {:?}", without.hand_over);
    let both = hand_over
        .both_open
        .expect("the second opened beside the first");
    assert_eq!(both.vram_budget_bytes, budget);
    assert!(
        both.prefetched_bytes > 0,
        "nothing loaded before its first step"
    );
    assert!(
        both.peak_vram_bytes <= budget,
        "both held {} of VRAM, over the budget {budget}",
        both.peak_vram_bytes
    );
    assert!(
        both.peak_pinned_bytes <= both.pin_ceiling_bytes,
        "both held {} pinned, over the ceiling {}",
        both.peak_pinned_bytes,
        both.pin_ceiling_bytes
    );
    let not_prefetched = without.hand_over.as_ref().expect("a hand-over");
    assert!(not_prefetched.both_open.is_none());
    // A byte short of two floors: the second does not fit beside the first, so it
    // opens after the first has left, and the video is the same.
    let apart = made(2 * floor - 1, true);
    let hand_over = apart.hand_over.as_ref().expect("a hand-over");
    assert!(hand_over.both_open.is_none(), "{hand_over:?}");
    assert_eq!(apart.latent, without.latent, "the latent differs");
}
