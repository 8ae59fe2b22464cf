//! The MP4 `stagehand video` writes: the frames encoded as H.264 by OpenH264 (Cisco's
//! encoder, built from source) and muxed into one video track by the `mp4` crate —
//! the encoder's Annex-B NAL units become length-prefixed samples, its first SPS and
//! PPS the track's `avcC`, every IDR frame a sync sample.

use std::path::Path;

use mp4::{
    AvcConfig, FourCC, MediaConfig, Mp4Config, Mp4Sample, Mp4Writer, TrackConfig, TrackType,
};
use openh264::encoder::{BitRate, Encoder, EncoderConfig, FrameRate, FrameType};
use openh264::formats::{RgbSliceU8, YUVBuffer};
use openh264::OpenH264API;

use stagehand::pipeline::Picture;

/// Bits per pixel per frame the encoder aims at, and the least bit rate: 0.3 keeps a
/// generated video's detail (832 × 480 at 16 fps: about 1.9 Mbit/s); a tiny video
/// still gets 500 kbit/s.
const BITS_PER_PIXEL: f64 = 0.3;
const LEAST_BITRATE: u32 = 500_000;

/// The track's clock: frame `i` starts at `i × TIMESCALE / fps`.
const TIMESCALE: u32 = 16_000;

/// Writes `frames` (all of one size, even sides) at `fps` as an H.264 MP4 at `path`.
pub fn write(path: &Path, frames: &[Picture], fps: u32) -> anyhow::Result<()> {
    let Some(first) = frames.first() else {
        anyhow::bail!("no frame to write");
    };
    let (width, height) = (first.width, first.height);
    if width % 2 != 0
        || height % 2 != 0
        || frames
            .iter()
            .any(|f| (f.width, f.height) != (width, height))
    {
        anyhow::bail!("H.264 wants frames of one size with even sides; got {width}×{height}");
    }
    let bitrate = (BITS_PER_PIXEL * (width * height) as f64 * fps as f64) as u32;
    let config = EncoderConfig::new()
        .bitrate(BitRate::from_bps(bitrate.max(LEAST_BITRATE)))
        .max_frame_rate(FrameRate::from_hz(fps as f32))
        // One thread: the same frames give the same bytes (slices follow threads),
        // and OpenH264 encodes a 480p frame in milliseconds.
        .num_threads(1);
    let mut encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
        .map_err(|error| anyhow::anyhow!("the H.264 encoder did not start: {error}"))?;
    let mut samples = Vec::with_capacity(frames.len());
    let (mut sps, mut pps) = (None, None);
    for frame in frames {
        let yuv = YUVBuffer::from_rgb_source(RgbSliceU8::new(&frame.pixels, (width, height)));
        let encoded = encoder
            .encode(&yuv)
            .map_err(|error| anyhow::anyhow!("the H.264 encoder failed on a frame: {error}"))?;
        let sync = matches!(encoded.frame_type(), FrameType::IDR | FrameType::I);
        let mut sample = Vec::new();
        for layer in (0..encoded.num_layers()).filter_map(|i| encoded.layer(i)) {
            for nal in (0..layer.nal_count()).filter_map(|i| layer.nal_unit(i)) {
                let nal = without_start_code(nal);
                match nal.first().map(|byte| byte & 0x1f) {
                    Some(7) => sps = sps.or_else(|| Some(nal.to_vec())),
                    Some(8) => pps = pps.or_else(|| Some(nal.to_vec())),
                    Some(_) => {
                        sample.extend_from_slice(&(nal.len() as u32).to_be_bytes());
                        sample.extend_from_slice(nal);
                    }
                    None => {}
                }
            }
        }
        samples.push((sample, sync));
    }
    let (Some(sps), Some(pps)) = (sps, pps) else {
        anyhow::bail!("the H.264 encoder gave no parameter sets");
    };
    mux(path, (width, height, fps), (sps, pps), samples)
}

/// The NAL unit after its Annex-B start code (`00 00 01` or `00 00 00 01`).
fn without_start_code(nal: &[u8]) -> &[u8] {
    match nal {
        [0, 0, 0, 1, rest @ ..] | [0, 0, 1, rest @ ..] => rest,
        _ => nal,
    }
}

fn mux(
    path: &Path,
    (width, height, fps): (usize, usize, u32),
    (sps, pps): (Vec<u8>, Vec<u8>),
    samples: Vec<(Vec<u8>, bool)>,
) -> anyhow::Result<()> {
    let file = std::fs::File::create(path)
        .map_err(|error| anyhow::anyhow!("{}: cannot be written ({error})", path.display()))?;
    let config = Mp4Config {
        major_brand: FourCC::from(*b"isom"),
        minor_version: 512,
        compatible_brands: [*b"isom", *b"iso2", *b"avc1", *b"mp41"]
            .map(FourCC::from)
            .to_vec(),
        // The track's clock for the movie too: the muxer converts each sample's
        // duration to it, truncating (1000 ms / 16 frames would lose 0.5 ms a frame).
        timescale: TIMESCALE,
    };
    let mut writer = Mp4Writer::write_start(std::io::BufWriter::new(file), &config)?;
    writer.add_track(&TrackConfig {
        track_type: TrackType::Video,
        timescale: TIMESCALE,
        language: "und".into(),
        media_conf: MediaConfig::AvcConfig(AvcConfig {
            width: u16::try_from(width)?,
            height: u16::try_from(height)?,
            seq_param_set: sps,
            pic_param_set: pps,
        }),
    })?;
    let duration = TIMESCALE / fps.max(1);
    for (index, (bytes, is_sync)) in samples.into_iter().enumerate() {
        let sample = Mp4Sample {
            start_time: index as u64 * u64::from(duration),
            duration,
            rendering_offset: 0,
            is_sync,
            bytes: bytes.into(),
        };
        writer.write_sample(1, &sample)?;
    }
    writer.write_end()?;
    Ok(())
}
