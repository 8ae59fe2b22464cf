//! A video's frames as an MP4 (feature `mp4`, which `cli` and `serve` turn on: the
//! file `stagehand video` writes and the bytes `serve`'s `/v1/videos/{id}/content`
//! answers): the frames encoded as H.264 by OpenH264 (Cisco's encoder, built from
//! source) and muxed into one video track by the `mp4` crate — the encoder's Annex-B
//! NAL units become length-prefixed samples, its first SPS and PPS the track's `avcC`,
//! every IDR frame a sync sample.

use std::io::{Cursor, Seek, Write};
use std::path::{Path, PathBuf};

use ::mp4::{
    AvcConfig, FourCC, MediaConfig, Mp4Config, Mp4Sample, Mp4Writer, TrackConfig, TrackType,
};
use openh264::encoder::{BitRate, Encoder, EncoderConfig, FrameRate, FrameType};
use openh264::formats::{RgbSliceU8, YUVBuffer};
use openh264::OpenH264API;

use super::super::Picture;

/// Why frames did not become an MP4. Match on the kind; new kinds may be added.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Mp4Error {
    /// There was no frame to encode.
    #[error("no frame to write")]
    NoFrames,
    /// The frames are not all of one size with even sides (what H.264's 4:2:0 takes).
    #[error("H.264 wants frames of one size with even sides; got {width}×{height}")]
    FrameSize { width: usize, height: usize },
    /// A side above the 65535 pixels MP4's track header holds.
    #[error("{width}×{height} is larger than an MP4 track holds (65535 a side)")]
    TooLarge { width: usize, height: usize },
    /// OpenH264 refused to start or to encode a frame.
    #[error("the H.264 encoder failed: {0}")]
    Encoder(#[from] openh264::Error),
    /// The encoder gave no SPS or PPS (the track's `avcC` needs both).
    #[error("the H.264 encoder gave no parameter sets")]
    NoParameterSets,
    /// The muxer failed.
    #[error("the MP4 muxer failed: {0}")]
    Mux(#[from] ::mp4::Error),
    /// The file could not be written.
    #[error("{}: cannot be written ({source})", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Bits per pixel per frame the encoder aims at, and the least bit rate: 0.3 keeps a
/// generated video's detail (832 × 480 at 16 fps: about 1.9 Mbit/s); a tiny video
/// still gets 500 kbit/s.
const BITS_PER_PIXEL: f64 = 0.3;
const LEAST_BITRATE: u32 = 500_000;

/// The track's clock: frame `i` starts at `i × TIMESCALE / fps`.
const TIMESCALE: u32 = 16_000;

/// Writes `frames` (all of one size, even sides) at `fps` as an H.264 MP4 at `path`.
pub fn write_mp4(path: &Path, frames: &[Picture], fps: u32) -> Result<(), Mp4Error> {
    let bytes = mp4_bytes(frames, fps)?;
    std::fs::write(path, bytes).map_err(|source| Mp4Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// `frames` (all of one size, even sides) at `fps` as the bytes of an H.264 MP4.
pub fn mp4_bytes(frames: &[Picture], fps: u32) -> Result<Vec<u8>, Mp4Error> {
    let Some(first) = frames.first() else {
        return Err(Mp4Error::NoFrames);
    };
    let (width, height) = (first.width, first.height);
    if width % 2 != 0
        || height % 2 != 0
        || frames
            .iter()
            .any(|f| (f.width, f.height) != (width, height))
    {
        return Err(Mp4Error::FrameSize { width, height });
    }
    let bitrate = (BITS_PER_PIXEL * (width * height) as f64 * fps as f64) as u32;
    let config = EncoderConfig::new()
        .bitrate(BitRate::from_bps(bitrate.max(LEAST_BITRATE)))
        .max_frame_rate(FrameRate::from_hz(fps as f32))
        // One thread: the same frames give the same bytes (slices follow threads),
        // and OpenH264 encodes a 480p frame in milliseconds.
        .num_threads(1);
    let mut encoder = Encoder::with_api_config(OpenH264API::from_source(), config)?;
    let mut samples = Vec::with_capacity(frames.len());
    let (mut sps, mut pps) = (None, None);
    for frame in frames {
        let yuv = YUVBuffer::from_rgb_source(RgbSliceU8::new(&frame.pixels, (width, height)));
        let encoded = encoder.encode(&yuv)?;
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
        return Err(Mp4Error::NoParameterSets);
    };
    let mut bytes = Cursor::new(Vec::new());
    mux(&mut bytes, (width, height, fps), (sps, pps), samples)?;
    Ok(bytes.into_inner())
}

/// The NAL unit after its Annex-B start code (`00 00 01` or `00 00 00 01`).
fn without_start_code(nal: &[u8]) -> &[u8] {
    match nal {
        [0, 0, 0, 1, rest @ ..] | [0, 0, 1, rest @ ..] => rest,
        _ => nal,
    }
}

fn mux(
    out: impl Write + Seek,
    (width, height, fps): (usize, usize, u32),
    (sps, pps): (Vec<u8>, Vec<u8>),
    samples: Vec<(Vec<u8>, bool)>,
) -> Result<(), Mp4Error> {
    let too_large = || Mp4Error::TooLarge { width, height };
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
    let mut writer = Mp4Writer::write_start(out, &config)?;
    writer.add_track(&TrackConfig {
        track_type: TrackType::Video,
        timescale: TIMESCALE,
        language: "und".into(),
        media_conf: MediaConfig::AvcConfig(AvcConfig {
            width: u16::try_from(width).map_err(|_| too_large())?,
            height: u16::try_from(height).map_err(|_| too_large())?,
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
