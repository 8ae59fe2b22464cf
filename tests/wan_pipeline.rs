//! A prompt to a video against diffusers' WanPipeline: a tiny Wan 2.2 A14B-shaped
//! pipeline (tests/fixtures/wan_pipeline: umT5 and the WAN VAE linked from the umt5
//! and wan_vae fixtures, two experts with boundary_ratio 0.875;
//! scripts/make-wan-pipeline-fixtures.py) makes the same video from the
//! same starting latent: 4 UniPC steps with guidance 4.0 then 2.5, each stage streamed
//! under a budget below its model.

mod common;

use std::path::Path;

use stagehand::families::FamilyError;
use stagehand::pipeline::{generate_video, PipelineError, PipelineRun, VideoRequest, WanParts};
use stagehand::run::{
    budgets_for, execute, prepare, verify_first_step, BudgetAsk, RunPlan, WorkloadKind,
};
use stagehand::settings::{Settings, Verify};

use common::reference::relative_difference;
use common::wan::{assemble, expected, fixtures, reference_request};

/// Relative to the largest magnitude: f32 on both sides through umT5, 4 guided steps
/// of two experts and the VAE, in other summation orders.
const TOLERANCE: f32 = 1e-4;

#[test]
fn a_prompt_becomes_wanpipelines_video() {
    // Proves the whole pipeline: the stages in WanPipeline's order, the experts split
    // at the boundary (2 steps each), the final latent and every frame's values as
    // diffusers' (1.9e-6 measured), the 8-bit pixels within one level, the experts'
    // first steps checked against their resident pass, every stage within its budget.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let parts = WanParts::folder(&assemble(dir.path())).expect("a Wan pipeline");
    assert_eq!(parts.boundary_ratio, Some(0.875));
    let settings = Settings::default();
    let video = generate_video(&parts, &reference_request(), &PipelineRun::quiet(&settings))
        .expect("makes a video");
    let names: Vec<&str> = video.stages.iter().map(|stage| stage.name).collect();
    assert_eq!(names, ["umt5", "transformer", "transformer_2", "vae"]);
    let steps: Vec<u64> = video
        .stages
        .iter()
        .map(|stage| stage.outcome.report.steps)
        .collect();
    assert_eq!(
        steps[1..3],
        [2, 2],
        "two steps at or above timestep 875, two below"
    );
    let latent_error = relative_difference(&video.latent, &expected("final"));
    assert_eq!(video.frames.len(), 9);
    let values: Vec<f32> = video
        .frames
        .iter()
        .flat_map(|frame| frame.values.iter().copied())
        .collect();
    let frames = expected("frames");
    let frame_error = relative_difference(&values, &frames);
    eprintln!("wan pipeline: final latent {latent_error:e}, frames {frame_error:e} of the largest magnitude from WanPipeline's");
    assert!(latent_error < TOLERANCE, "latent off by {latent_error}");
    assert!(frame_error < TOLERANCE, "frames off by {frame_error}");
    let pixels: Vec<u8> = video
        .frames
        .iter()
        .flat_map(|frame| frame.pixels.iter().copied())
        .collect();
    let levels = pixels
        .iter()
        .zip(&frames)
        .map(|(&got, &want)| (f32::from(got) - (want * 255.0).round()).abs())
        .fold(0f32, f32::max);
    assert!(levels <= 1.0, "a pixel {levels} levels off");
    // The switch is measured: the second expert's first step moved its blocks, and
    // the first expert's steps computed.
    let hand_over = video.hand_over.as_ref().expect("two experts: a hand-over");
    eprintln!("wan pipeline: {hand_over:?}");
    assert!(hand_over.first_step_bytes.iter().sum::<u64>() > 0);
    assert!(hand_over.step_compute_seconds > 0.0 && hand_over.stall_seconds() >= 0.0);
    // The second expert's first step moved what its plan says: every block read from
    // the disk once (the plan caches every streamed block pinned: nothing is read
    // again), every block copied to VRAM once, and beyond that only the next step's
    // first blocks, prefetched into the ring.
    let second = &video.stages[2].outcome;
    let [disk_to_pinned, pinned_to_vram, disk_to_vram] = hand_over.first_step_bytes;
    let plan = &second.report.plan;
    assert_eq!(plan.pins.disk_bytes_per_step, 0, "{plan:?}");
    assert_eq!(disk_to_pinned + disk_to_vram, second.model_bytes);
    let to_vram = pinned_to_vram + disk_to_vram;
    assert!(to_vram >= second.model_bytes, "{to_vram} to VRAM");
    assert!(
        to_vram - second.model_bytes <= plan.vram.ring_bytes(),
        "{to_vram} to VRAM: more than the model and a ring ({plan:?})"
    );
    // The experts' first steps were checked after sampling, not at the end of the
    // first expert's run (between the experts).
    assert!(
        hand_over.first_step_checks_seconds.is_some(),
        "no deferred check"
    );
    for stage in &video.stages {
        let report = &stage.outcome.report;
        // The experts' first step is recomputed from resident blocks (the pipeline's
        // cheap check), once each; every stage stays within its budget.
        if report.steps > 1 {
            assert_eq!(report.verified_steps, 1, "{}: unchecked", stage.name);
            assert_eq!(report.verify, Verify::First, "{}", stage.name);
        }
        let budget = stage.outcome.budgets.vram_budget_bytes;
        assert!(
            report.stats.vram.peak_used_bytes <= budget,
            "{}: over its budget",
            stage.name
        );
    }
}

#[test]
fn the_deferred_first_step_check_catches_a_changed_output() {
    // Proves the check the pipeline makes after sampling still checks: an expert run
    // that checked only its weights and kept its outputs passes `verify_first_step`
    // as computed (then counted verified, `first`), and fails it by kind, naming step
    // 0 and the value, once one bit of that step's output is changed.
    let model = fixtures().join("wan_pipeline/transformer");
    let settings = Settings {
        verify: Some(Verify::Weights),
        ..Settings::default()
    };
    let prepared = prepare(&model, WorkloadKind::Auto, 1, &settings, false).expect("opens");
    let budgets = budgets_for(&prepared, &settings, BudgetAsk::steps(2));
    let plan = RunPlan {
        keep_outputs: true,
        ..RunPlan::new(&settings, budgets, 2)
    };
    let mut outcome = execute(&prepared, plan).expect("runs");
    assert_eq!(outcome.report.verified_steps, 0, "checked by the run");
    let mut changed = outcome.report.clone();
    verify_first_step(&prepared, &settings, &mut outcome).expect("the first step matches");
    assert_eq!(outcome.report.verified_steps, 1);
    assert_eq!(outcome.report.verify, Verify::First);
    let first = changed.outputs.values_mut().next().expect("a kept output");
    first[3] = f32::from_bits(first[3].to_bits() ^ 1);
    outcome.report = changed;
    match verify_first_step(&prepared, &settings, &mut outcome) {
        Err(FamilyError::Mismatch {
            step: 0, index: 3, ..
        }) => {}
        other => panic!("a changed bit passed the check: {other:?}"),
    }
    assert_eq!(outcome.report.verified_steps, 0, "counted though it failed");
}

#[test]
fn what_the_pipeline_cannot_make_is_refused_by_name() {
    // Proves a frame count that is not 4k + 1, a latent of the wrong size and a
    // folder without its scheduler are refused before any model opens, saying what to give.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let folder = assemble(dir.path());
    let parts = WanParts::folder(&folder).expect("a Wan pipeline");
    let settings = Settings::default();
    let frames = VideoRequest {
        frames: 10,
        ..reference_request()
    };
    let error = generate_video(&parts, &frames, &PipelineRun::quiet(&settings))
        .err()
        .expect("refused");
    assert!(error.to_string().contains("give 9 or 13"), "{error}");
    let latent = VideoRequest {
        latents: Some(vec![0.0; 5]),
        ..reference_request()
    };
    let error = generate_video(&parts, &latent, &PipelineRun::quiet(&settings))
        .err()
        .expect("refused");
    assert!(
        matches!(
            error,
            PipelineError::BadField {
                field: "latents",
                ..
            }
        ),
        "{error}"
    );
    std::fs::remove_dir_all(folder.join("scheduler")).expect("removes");
    let error = WanParts::folder(&folder).expect_err("no scheduler");
    assert!(error.to_string().contains("scheduler"), "{error}");
}

/// The duration (µs) and the frames of an MP4's one video track, decoded by
/// OpenH264 as RGB bytes.
fn decode_mp4(path: &Path) -> (u32, Vec<Vec<u8>>) {
    let file = std::fs::File::open(path).expect("the MP4");
    let size = file.metadata().expect("metadata").len();
    let mut reader =
        mp4::Mp4Reader::read_header(std::io::BufReader::new(file), size).expect("an MP4");
    let track = reader.tracks().values().next().expect("a track");
    let (track_id, count) = (track.track_id(), track.sample_count());
    let duration_us = track.duration().as_micros() as u32;
    let mut decoder = openh264::decoder::Decoder::new().expect("a decoder");
    let track = reader.tracks().get(&track_id).expect("the track");
    let (sps, pps) = {
        let avc = &track
            .trak
            .mdia
            .minf
            .stbl
            .stsd
            .avc1
            .as_ref()
            .expect("avc1")
            .avcc;
        (
            avc.sequence_parameter_sets[0].bytes.clone(),
            avc.picture_parameter_sets[0].bytes.clone(),
        )
    };
    let annex_b = |nals: &mut Vec<u8>, nal: &[u8]| {
        nals.extend_from_slice(&[0, 0, 0, 1]);
        nals.extend_from_slice(nal);
    };
    let mut frames = Vec::new();
    for id in 1..=count {
        let sample = reader
            .read_sample(track_id, id)
            .expect("reads")
            .expect("a sample");
        let mut nals = Vec::new();
        if id == 1 {
            annex_b(&mut nals, &sps);
            annex_b(&mut nals, &pps);
        }
        let mut at = 0;
        while at + 4 <= sample.bytes.len() {
            let length =
                u32::from_be_bytes(sample.bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            annex_b(&mut nals, &sample.bytes[at + 4..at + 4 + length]);
            at += 4 + length;
        }
        if let Some(yuv) = decoder.decode(&nals).expect("decodes") {
            let mut rgb = vec![0u8; 48 * 64 * 3];
            yuv.write_rgb8(&mut rgb);
            frames.push(rgb);
        }
    }
    (duration_us, frames)
}

#[test]
fn stagehand_video_writes_the_frames_and_an_mp4_that_decodes_to_them() {
    // Proves `stagehand video` end to end on the tiny pipeline: the PNG frames are
    // WanPipeline's pixels within one level, and the H.264 MP4 (9 samples at 16 fps)
    // decodes with OpenH264 to pictures close to them (lossy: a PSNR above 28 dB on
    // these noise-like frames of a random model, H.264's worst case; 31 measured).
    let dir = tempfile::tempdir().expect("a temporary folder");
    let folder = assemble(dir.path());
    // The fixture's `latent` tensor is diffusers' starting noise.
    let latents = fixtures().join("wan_pipeline/expected.safetensors");
    let (out, frames_dir) = (dir.path().join("fox.mp4"), dir.path().join("frames"));
    let request = reference_request();
    let output = common::stagehand()
        .args(["video", "--model"])
        .arg(&folder)
        .args([
            "--prompt",
            &request.prompt,
            "--negative-prompt",
            &request.negative_prompt,
        ])
        .args([
            "--frames", "9", "--width", "48", "--height", "64", "--steps", "4",
        ])
        .args(["--guidance", "4", "--guidance-2", "2.5", "--latents"])
        .arg(&latents)
        .arg("--frames-dir")
        .arg(&frames_dir)
        .arg("--out")
        .arg(&out)
        .args(["--json", "--device", "cpu"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stagehand video failed: {stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(summary["frames"], 9);
    assert!(summary["hand_over"]["stall_seconds"].is_f64(), "{summary}");
    let stages: Vec<&str> = summary["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .filter_map(|s| s["stage"].as_str())
        .collect();
    assert_eq!(stages, ["umt5", "transformer", "transformer_2", "vae"]);
    let expected_frames = expected("frames");
    let plane = 48 * 64 * 3;
    let mut pngs = Vec::new();
    for index in 0..9 {
        let file =
            std::fs::File::open(frames_dir.join(format!("{index:03}.png"))).expect("a frame");
        let mut reader = png::Decoder::new(std::io::BufReader::new(file))
            .read_info()
            .expect("a PNG");
        let mut pixels = vec![0; reader.output_buffer_size().expect("a size")];
        reader.next_frame(&mut pixels).expect("decodes");
        let want = &expected_frames[index * plane..(index + 1) * plane];
        let worst = pixels
            .iter()
            .zip(want)
            .map(|(&got, &want)| (f32::from(got) - (want * 255.0).round()).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1.0, "frame {index}: a pixel {worst} levels off");
        pngs.push(pixels);
    }
    let (duration_us, decoded) = decode_mp4(&out);
    assert_eq!(decoded.len(), 9, "every frame decodes");
    assert_eq!(duration_us, 562_500, "9 frames at 16 fps");
    let mut least = f64::INFINITY;
    for (index, (mp4, png)) in decoded.iter().zip(&pngs).enumerate() {
        let mse = mp4
            .iter()
            .zip(png)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum::<f64>()
            / plane as f64;
        let psnr = 10.0 * (255.0f64.powi(2) / mse.max(1e-9)).log10();
        assert!(psnr > 28.0, "frame {index}: PSNR {psnr:.1} dB");
        least = least.min(psnr);
    }
    eprintln!("stagehand video: the MP4's frames decode within {least:.1} dB PSNR of the PNGs");
}
