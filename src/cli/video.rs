//! `stagehand video`: a prompt to a video through a diffusers Wan pipeline folder —
//! umT5 for the prompt and the negative prompt, the transformer (or Wan 2.2 A14B's two
//! experts, handed over at the boundary), the WAN VAE — each model streamed under the
//! same budgets in turn and checked as every run is. Writes the frames as PNGs
//! (`--frames-dir`) and the video as an H.264 MP4 (`--out FILE.mp4`); the summary
//! gives each stage's time, bytes over each link, peaks and budget.

use std::path::PathBuf;

use serde::Serialize;

use super::image::{
    bad, check_out, pipeline_failure, pipeline_settings, read_rgb, stage_line, with_pipeline_run,
    StageOutput,
};
use super::{CommandResult, Failure};
use stagehand::families::flux::read_tensors;
use stagehand::families::wan_vae::WanTile;
use stagehand::pipeline::{
    generate_video, write_mp4, HandOver, Video, VideoFiles, VideoRequest, WanParts,
};
use stagehand::settings::SettingsArgs;

#[derive(Debug, clap::Args)]
pub struct VideoArgs {
    /// A diffusers Wan pipeline folder (model_index.json, text_encoder/, tokenizer/,
    /// transformer/ and, for Wan 2.2 A14B, transformer_2/, vae/, scheduler/), or the
    /// transformer's file (ComfyUI's diffusion_models/wan2.2_t2v_high_noise_14B_fp16.safetensors,
    /// Wan-AI's names) with the other parts given by --model-2, --umt5,
    /// --umt5-tokenizer, --vae and --scheduler.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    /// The low-noise expert's file (Wan 2.2 A14B's transformer_2; ComfyUI's
    /// wan2.2_t2v_low_noise_14B_fp16.safetensors): the experts switch at timestep 875
    /// (900 for image-to-video), as the published pipelines do.
    #[arg(long, value_name = "FILE")]
    pub model_2: Option<PathBuf>,
    /// umT5's encoder file (ComfyUI's text_encoders/umt5_xxl_fp16.safetensors) or folder.
    #[arg(long, value_name = "PATH")]
    pub umt5: Option<PathBuf>,
    /// umT5's tokenizer folder (tokenizer.json), for umT5 given as a file.
    #[arg(long, value_name = "DIR")]
    pub umt5_tokenizer: Option<PathBuf>,
    /// The WAN VAE: its single file (ComfyUI's vae/wan_2.1_vae.safetensors, or
    /// wan2.2_vae.safetensors for TI2V-5B; Wan-AI's names, the config from its shapes)
    /// or its diffusers folder (AutoencoderKLWan: config.json and weights).
    #[arg(long, value_name = "PATH")]
    pub vae: Option<PathBuf>,
    /// The sampler's scheduler_config.json (UniPCMultistepScheduler or
    /// FlowMatchEulerDiscreteScheduler), for a model given as files.
    #[arg(long, value_name = "FILE")]
    pub scheduler: Option<PathBuf>,
    /// What the video shows.
    #[arg(long)]
    pub prompt: String,
    /// What it should not show (classifier-free guidance's other prompt).
    #[arg(long, default_value = "")]
    pub negative_prompt: String,
    /// Frames: 4k + 1 (Wan 2.2's default 81, five seconds at 16 fps).
    #[arg(long, default_value_t = 81)]
    pub frames: usize,
    /// Width in pixels (a multiple of 16).
    #[arg(long, default_value_t = 832)]
    pub width: usize,
    /// Height in pixels (a multiple of 16).
    #[arg(long, default_value_t = 480)]
    pub height: usize,
    /// Denoising steps (WanPipeline's default: 50).
    #[arg(long, default_value_t = 50)]
    pub steps: usize,
    /// Classifier-free guidance (WanPipeline's default 5.0; 1 or less: none, one pass a step).
    #[arg(long, default_value_t = 5.0)]
    pub guidance: f32,
    /// The low-noise expert's guidance (default: --guidance).
    #[arg(long)]
    pub guidance_2: Option<f32>,
    /// Seed of the starting noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Start from this noise (safetensors `latent` [1, 16, (frames−1)/4+1, H/8, W/8],
    /// diffusers' `latents`) instead of seeded noise.
    #[arg(long, value_name = "FILE")]
    pub latents: Option<PathBuf>,
    /// The first frame, for an image-to-video pipeline (Wan 2.2 I2V-A14B): a PNG of
    /// --width × --height.
    #[arg(long, value_name = "FILE.png")]
    pub image: Option<PathBuf>,
    /// The last frame too (with --image): the video goes from one to the other.
    #[arg(long, value_name = "FILE.png", requires = "image")]
    pub last_image: Option<PathBuf>,
    /// umT5's prompt length in tokens, padded to it (diffusers' `max_sequence_length`).
    #[arg(long, default_value_t = 512)]
    pub max_sequence_length: usize,
    /// Decode in tiles of this many latent positions a side (8 pixels each), every
    /// 3/4 of a tile, blended as diffusers' tiled decode (its default: 32); default:
    /// the whole frame when the VRAM budget leaves room for its activations, else the
    /// largest tile that fits.
    #[arg(long, value_name = "POSITIONS")]
    pub vae_tile: Option<usize>,
    /// Also write each frame as DIR/NNN.png (the folder is created).
    #[arg(long, value_name = "DIR")]
    pub frames_dir: Option<PathBuf>,
    /// Frames per second of the MP4 (Wan's 16).
    #[arg(long, default_value_t = 16)]
    pub fps: u32,
    /// The MP4 to write.
    #[arg(long, value_name = "FILE.mp4")]
    pub out: PathBuf,
    /// Open Wan 2.2 A14B's low-noise expert only once the high-noise expert has
    /// given back every byte, instead of during its last step (both in one budget,
    /// the second's first blocks loading meanwhile): to compare the two hand-overs.
    #[arg(long)]
    pub no_hand_over_prefetch: bool,
    /// Print the result and each stage's summary as JSON at the end.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Debug, Serialize)]
struct VideoOutput {
    video: String,
    frames: usize,
    frames_dir: Option<String>,
    width: usize,
    height: usize,
    seconds: f64,
    stages: Vec<StageOutput>,
    /// The switch between the two experts, when both took steps.
    hand_over: Option<HandOverOutput>,
}

#[derive(Debug, Serialize)]
struct HandOverOutput {
    stall_seconds: f64,
    close_seconds: f64,
    open_stall_seconds: f64,
    step_compute_seconds: f64,
    /// Both experts' first-step checks, after sampling (off the switch).
    first_step_checks_seconds: Option<f64>,
    /// The second expert's first step: bytes per link.
    first_step_disk_to_pinned_bytes: u64,
    first_step_pinned_to_vram_bytes: u64,
    first_step_disk_to_vram_bytes: u64,
    /// The second expert opened during the first's last step, both in one budget.
    prefetched: bool,
    /// Its model bytes in VRAM before its first step began.
    prefetched_bytes: u64,
    /// The most VRAM and pinned RAM both experts held at once, and the one budget.
    both_open_peak_vram_bytes: Option<u64>,
    both_open_peak_pinned_bytes: Option<u64>,
    both_open_vram_budget_bytes: Option<u64>,
    both_open_pin_ceiling_bytes: Option<u64>,
    /// The least VRAM each expert's plan runs in: two must fit for the prefetch.
    expert_floor_vram_bytes: Option<u64>,
}

impl HandOverOutput {
    fn of(hand_over: &HandOver) -> Self {
        let [disk_to_pinned, pinned_to_vram, disk_to_vram] = hand_over.first_step_bytes;
        Self {
            stall_seconds: hand_over.stall_seconds(),
            close_seconds: hand_over.close_seconds,
            open_stall_seconds: hand_over.open_stall_seconds,
            step_compute_seconds: hand_over.step_compute_seconds,
            first_step_checks_seconds: hand_over.first_step_checks_seconds,
            first_step_disk_to_pinned_bytes: disk_to_pinned,
            first_step_pinned_to_vram_bytes: pinned_to_vram,
            first_step_disk_to_vram_bytes: disk_to_vram,
            prefetched: hand_over.both_open.is_some(),
            prefetched_bytes: hand_over.both_open.map_or(0, |both| both.prefetched_bytes),
            both_open_peak_vram_bytes: hand_over.both_open.map(|both| both.peak_vram_bytes),
            both_open_peak_pinned_bytes: hand_over.both_open.map(|both| both.peak_pinned_bytes),
            both_open_vram_budget_bytes: hand_over.both_open.map(|both| both.vram_budget_bytes),
            both_open_pin_ceiling_bytes: hand_over.both_open.map(|both| both.pin_ceiling_bytes),
            expert_floor_vram_bytes: (hand_over.both_open).map(|both| both.expert_floor_vram_bytes),
        }
    }
}

/// The summary's line on the switch between the experts.
fn hand_over_line(hand_over: &HandOver) -> String {
    let [disk_to_pinned, pinned_to_vram, disk_to_vram] =
        hand_over.first_step_bytes.map(stagehand_actors::Bytes);
    let checks = match hand_over.first_step_checks_seconds {
        Some(seconds) => {
            format!("; the experts' first-step checks ran after sampling, {seconds:.2} s")
        }
        None => String::new(),
    };
    let prefetch = match hand_over.both_open {
        Some(both) => format!(
            "; the second opened during the first's last step and loaded {} before its first step, both holding at most {} VRAM / {} pinned of one budget of {} / {}",
            stagehand_actors::Bytes(both.prefetched_bytes),
            stagehand_actors::Bytes(both.peak_vram_bytes),
            stagehand_actors::Bytes(both.peak_pinned_bytes),
            stagehand_actors::Bytes(both.vram_budget_bytes),
            stagehand_actors::Bytes(both.pin_ceiling_bytes),
        ),
        None => "; the second opened after the first had given back every byte (no prefetch: turned off, or two experts' floors do not fit in the budget)".into(),
    };
    format!(
        "  hand-over     {:>8.2} s  not computing between the experts (closing the first {:.2} s; opening the second and its first blocks' waits {:.2} s) beside {:.2} s of compute a step; the second's first step read {disk_to_pinned} + {disk_to_vram} from disk, copied {pinned_to_vram} from pinned RAM{prefetch}{checks}",
        hand_over.stall_seconds(),
        hand_over.close_seconds,
        hand_over.open_stall_seconds,
        hand_over.step_compute_seconds,
    )
}

/// The starting noise of `--latents`: the tensor `latent`, its size checked by the
/// pipeline against the request's.
fn latents_of(args: &VideoArgs) -> Result<Option<Vec<f32>>, Failure> {
    let Some(path) = &args.latents else {
        return Ok(None);
    };
    let tensors = read_tensors(path).map_err(|error| bad(error.to_string()))?;
    match tensors.into_iter().find(|(name, ..)| name == "latent") {
        Some((_, _, values)) => Ok(Some(values)),
        None => Err(bad(format!("{}: no tensor `latent`", path.display()))),
    }
}

/// The PNG of `--image` or `--last-image`, at the video's size.
fn image_of(
    flag: &str,
    path: &Option<PathBuf>,
    args: &VideoArgs,
) -> Result<Option<Vec<f32>>, Failure> {
    (path.as_ref())
        .map(|path| read_rgb(flag, path, [args.width, args.height]))
        .transpose()
}

pub fn execute(args: VideoArgs) -> CommandResult {
    let settings = pipeline_settings(&args.settings, "video")?;
    check_out(&args.out)?;
    if args.out.extension().and_then(|ext| ext.to_str()) != Some("mp4") {
        return Err(bad(format!(
            "--out {}: the video is written as H.264 in MP4; name a .mp4 file",
            args.out.display()
        )));
    }
    if args.fps == 0 {
        return Err(bad("--fps 0: give the frames per second (Wan's 16)".into()));
    }
    if args.vae_tile == Some(0) {
        return Err(bad(
            "--vae-tile 0: a tile is at least one latent position (8 pixels) a side; leave it out to tile only when the budget needs it".into(),
        ));
    }
    let files = VideoFiles {
        model_2: args.model_2.clone(),
        umt5: args.umt5.clone(),
        umt5_tokenizer: args.umt5_tokenizer.clone(),
        vae: args.vae.clone(),
        scheduler: args.scheduler.clone(),
    };
    let parts = WanParts::locate(&args.model, &files).map_err(pipeline_failure)?;
    let request = VideoRequest {
        prompt: args.prompt.clone(),
        negative_prompt: args.negative_prompt.clone(),
        width: args.width,
        height: args.height,
        frames: args.frames,
        steps: args.steps,
        guidance: args.guidance,
        guidance_2: args.guidance_2,
        seed: args.seed,
        latents: latents_of(&args)?,
        max_sequence_length: args.max_sequence_length,
        image: image_of("--image", &args.image, &args)?,
        last_image: image_of("--last-image", &args.last_image, &args)?,
        vae_tile: args.vae_tile.map(WanTile::square),
        hand_over_prefetch: !args.no_hand_over_prefetch,
    };
    let started = std::time::Instant::now();
    let quiet = args.quiet || args.json;
    let video = with_pipeline_run(&settings, quiet, |run| {
        generate_video(&parts, &request, run)
    })?;
    write_outputs(&args, &video)?;
    print_result(&args, &video, started.elapsed().as_secs_f64())
}

/// The frames as PNGs (when asked) and the MP4.
fn write_outputs(args: &VideoArgs, video: &Video) -> Result<(), Failure> {
    if let Some(dir) = &args.frames_dir {
        std::fs::create_dir_all(dir).map_err(|error| {
            bad(format!(
                "--frames-dir {}: cannot be created ({error})",
                dir.display()
            ))
        })?;
        let text = [
            ("prompt", args.prompt.clone()),
            ("seed", args.seed.to_string()),
            ("model", args.model.display().to_string()),
            (
                "software",
                format!("stagehand {}", env!("CARGO_PKG_VERSION")),
            ),
        ]
        .map(|(keyword, value)| (keyword.to_string(), value));
        for (index, frame) in video.frames.iter().enumerate() {
            let path = dir.join(format!("{index:03}.png"));
            frame.write_png(&path, &text).map_err(pipeline_failure)?;
        }
    }
    write_mp4(&args.out, &video.frames, args.fps).map_err(Failure::run_failed)
}

fn print_result(args: &VideoArgs, video: &Video, seconds: f64) -> CommandResult {
    if args.json {
        let output = VideoOutput {
            video: args.out.display().to_string(),
            frames: video.frames.len(),
            frames_dir: args
                .frames_dir
                .as_ref()
                .map(|dir| dir.display().to_string()),
            width: args.width,
            height: args.height,
            seconds,
            stages: video.stages.iter().map(StageOutput::of).collect(),
            hand_over: video.hand_over.as_ref().map(HandOverOutput::of),
        };
        let json = serde_json::to_string_pretty(&output).map_err(Failure::run_failed)?;
        println!("{json}");
        return Ok(());
    }
    println!("{}", args.out.display());
    if !args.quiet {
        eprintln!(
            "video: {} frames of {}×{} in {seconds:.2} s, {} steps, every stage checked against its resident pass",
            video.frames.len(),
            args.width,
            args.height,
            args.steps
        );
        for stage in &video.stages {
            eprintln!("{}", stage_line(stage));
            if let Some(hand_over) =
                (video.hand_over.as_ref()).filter(|_| stage.name == "transformer_2")
            {
                eprintln!("{}", hand_over_line(hand_over));
            }
        }
    }
    Ok(())
}
