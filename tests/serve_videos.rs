//! `stagehand serve`'s videos (OpenAI's Videos API) over the tiny Wan 2.2 pipeline of
//! `tests/fixtures/wan_pipeline`, through HTTP against the built binary: a job is
//! queued at once, polled to `completed` with its progress, its MP4 downloaded,
//! listed and deleted; a job queued behind another has no content yet (409) and a
//! DELETE cancels it (404 after); a DELETE of a running job stops its pipeline at the
//! next step; bad input is a 400 naming the field, an unknown id a 404; a job the
//! pipeline refuses ends `failed` with its error; a full job table is a 429. The tiny
//! Wan 2.2 image-to-video pipeline of `tests/fixtures/wan_i2v_pipeline` makes its
//! video from the PNG a client sends as the `input_reference` file part, the same MP4
//! as the pipeline in-process; the image's refusals name it. Each video is 5 frames of
//! 48 × 64, one or a few steps, a 16-token prompt.
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use std::path::Path;

use serde_json::{json, Value};
use serve_support::{eventually, metric, Reply, Server};

const MODEL: &str = "wan_pipeline";
/// The image-to-video fixture, served under its folder's name.
const I2V_MODEL: &str = "wan_i2v_pipeline";

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn pipeline() -> String {
    fixture("wan_pipeline").display().to_string()
}

/// A small video request: `steps` steps of 5 frames, no guidance.
fn small(prompt: &str, steps: usize) -> Value {
    json!({
        "model": MODEL, "prompt": prompt, "size": "48x64", "seconds": "0.25",
        "num_inference_steps": steps, "max_sequence_length": 16, "guidance_scale": 1.0,
        "seed": 3
    })
}

/// Polls a job until it has finished; its last object.
fn finished(server: &Server, id: &str) -> Value {
    let mut object = Value::Null;
    eventually("the video job finishes", || {
        let reply = server.get(&format!("/v1/videos/{id}"));
        assert_eq!(reply.status, 200, "{}", reply.text());
        object = reply.json();
        let progress = object["progress"].as_u64().expect("progress");
        assert!(progress <= 100, "{object}");
        matches!(object["status"].as_str(), Some("completed" | "failed"))
    });
    object
}

#[test]
fn a_video_job_is_queued_polled_downloaded_listed_cancelled_and_deleted() {
    // Proves the job shape end to end on a real server: create answers at once with a
    // queued video object, a job queued behind it has no content (409) and is
    // cancelled by DELETE (404 after), the first completes with progress 100 and its
    // MP4 downloads; list shows the jobs kept.
    let server = Server::start(&["--model", &pipeline()]);
    let created = server.post("/v1/videos", &small("a red fox in the snow", 8));
    assert_eq!(created.status, 200, "{}", created.text());
    assert_eq!(created.header("openai-poll-after-ms"), Some("1000"));
    let first = created.json();
    assert_eq!(first["object"], "video");
    assert_eq!(first["status"], "queued");
    assert_eq!(first["progress"], 0);
    assert_eq!(first["model"], MODEL);
    assert_eq!(first["size"], "48x64");
    assert_eq!(first["seconds"], "0.25");
    let first_id = first["id"].as_str().expect("an id").to_string();
    assert!(first_id.starts_with("video_"), "{first_id}");

    let behind = server.post("/v1/videos", &small("a lighthouse", 1)).json();
    let behind_id = behind["id"].as_str().expect("an id").to_string();
    let early = server.get(&format!("/v1/videos/{behind_id}/content"));
    early.assert_error(409, "poll GET /v1/videos/");
    assert_eq!(early.json()["error"]["code"], "video_not_ready");
    let deleted = server.request("DELETE", &format!("/v1/videos/{behind_id}"), &[], None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_eq!(
        deleted.json(),
        json!({"id": behind_id, "object": "video.deleted", "deleted": true})
    );
    server
        .get(&format!("/v1/videos/{behind_id}"))
        .assert_error(404, "no video");

    let done = finished(&server, &first_id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["progress"], 100);
    assert!(done["completed_at"].as_u64().is_some(), "{done}");
    let mp4 = server.get(&format!("/v1/videos/{first_id}/content"));
    assert_eq!(mp4.status, 200, "{}", mp4.text());
    assert_eq!(mp4.header("content-type"), Some("video/mp4"));
    assert_eq!(&mp4.body[4..8], b"ftyp", "an MP4 starts with its ftyp box");

    let listed = server.get("/v1/videos?order=asc&limit=10").json();
    assert_eq!(listed["object"], "list");
    assert_eq!(listed["data"][0]["id"], first_id.as_str());
    assert_eq!(listed["has_more"], false);
    let deleted = server.request("DELETE", &format!("/v1/videos/{first_id}"), &[], None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    server
        .get(&format!("/v1/videos/{first_id}/content"))
        .assert_error(404, "no video");
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}

#[test]
fn bad_video_requests_are_400s_naming_the_field_and_a_refused_job_fails() {
    // Proves the refusals a client can act on: each names its field or limit; an
    // unknown id is a 404; an image model asked for a video (and the video model for
    // an image or an embedding) is a 400 naming the endpoint to use; the official
    // clients' form body is read as JSON is; a prompt the pipeline refuses ends the
    // job `failed` with the reason.
    let flux = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/flux-tiny");
    let flux = flux.display().to_string();
    let server = Server::start(&["--model", &pipeline(), "--model", &flux]);
    let with = |key: &str, value: Value| {
        let mut body = small("a fox", 1);
        body[key] = value;
        server.post("/v1/videos", &body)
    };
    let param = |reply: &Reply| reply.json()["error"]["param"].clone();
    let cases = [
        ("size", json!("50x50"), "multiples of 16"),
        ("size", json!("4096x4096"), "limits.max_video_pixels"),
        ("seconds", json!("60"), "limits.max_video_frames"),
        ("num_inference_steps", json!(0), "limits.max_video_steps"),
        ("fps", json!(0), "fps = 0"),
        (
            "input_reference",
            json!("x"),
            "send a PNG of the video's size",
        ),
    ];
    for (key, value, needle) in cases {
        let reply = with(key, value);
        reply.assert_error(400, needle);
        assert_eq!(param(&reply), key, "{}", reply.text());
    }
    let mut both = small("a fox", 1);
    both["num_frames"] = json!(5);
    let reply = server.post("/v1/videos", &both);
    reply.assert_error(400, "not both");
    with("quality", json!("hd")).assert_error(400, "quality");
    with("model", json!("sora-2")).assert_error(404, "not served here");
    server
        .get("/v1/videos/video_none")
        .assert_error(404, "no video");
    server
        .get("/v1/videos/video_none/content")
        .assert_error(404, "no video");
    let embed = json!({"model": MODEL, "input": "x"});
    server
        .post("/v1/embeddings", &embed)
        .assert_error(400, "makes videos");
    let image = json!({"model": MODEL, "prompt": "x"});
    server
        .post("/v1/images/generations", &image)
        .assert_error(400, "POST /v1/videos");
    with("model", json!("flux-tiny")).assert_error(400, "makes no videos");
    assert_eq!(
        server.get("/v1/videos").json()["data"],
        json!([]),
        "a refused request left a job"
    );

    let form = "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwan_pipeline\r\n--b\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n \r\n--b\r\nContent-Disposition: form-data; name=\"size\"\r\n\r\n48x64\r\n--b\r\nContent-Disposition: form-data; name=\"num_frames\"\r\n\r\n1\r\n--b\r\nContent-Disposition: form-data; name=\"num_inference_steps\"\r\n\r\n1\r\n--b--\r\n";
    let headers = [("Content-Type", "multipart/form-data; boundary=b")];
    let created = server.request("POST", "/v1/videos", &headers, Some(form.as_bytes()));
    assert_eq!(created.status, 200, "{}", created.text());
    assert_eq!(created.json()["seconds"], "0");
    let id = created.json()["id"].as_str().expect("an id").to_string();
    let failed = finished(&server, &id);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "invalid_request");
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("prompt is empty"), "{message}");
    server
        .get(&format!("/v1/videos/{id}/content"))
        .assert_error(409, "prompt is empty");
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
    assert!(!stopped.stderr.contains("panicked"), "{}", stopped.stderr);
}

#[test]
fn deleting_a_running_video_stops_its_pipeline_at_the_next_step() {
    // Proves DELETE reaches a job its model's thread has started: the pipeline stops
    // inside its denoising steps (its VAE never runs: the stage series count one VAE,
    // the next job's), the thread takes the next job, and every byte the stopped
    // stage held is back (the model holds no VRAM and no pinned RAM after both).
    let server = Server::start(&["--model", &pipeline()]);
    let long = server.post("/v1/videos", &small("a long video", 30)).json();
    let id = long["id"].as_str().expect("an id").to_string();
    eventually("the long job is denoising", || {
        let object = server.get(&format!("/v1/videos/{id}")).json();
        assert_ne!(
            object["status"], "completed",
            "30 steps ended before a poll saw one"
        );
        object["progress"].as_u64().unwrap_or(0) > 5
    });
    let deleted = server.request("DELETE", &format!("/v1/videos/{id}"), &[], None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    let next = server.post("/v1/videos", &small("a short video", 1)).json();
    let next_id = next["id"].as_str().expect("an id").to_string();
    assert_eq!(finished(&server, &next_id)["status"], "completed");
    let metrics = server.get("/metrics").text();
    let vae_runs = metric(
        &metrics,
        "stagehand_pipeline_stage_duration_seconds_count",
        &[("model", MODEL), ("stage", "vae")],
    );
    assert_eq!(vae_runs, 1.0, "the deleted job's VAE ran");
    let residency = server.get("/residency").json();
    let model = &residency["models"][0];
    assert_eq!(model["kind"], "video", "{residency}");
    assert_eq!(
        (&model["vram_bytes"], &model["pinned_bytes"]),
        (&json!(0), &json!(0)),
        "{residency}"
    );
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}

#[test]
fn a_full_job_table_is_a_429_and_a_video_model_runs_in_a_shared_budget() {
    // Proves the table's bound over HTTP (limits.max_video_jobs = 1: a second job
    // while the first runs is a 429 naming the limit; once the first has finished a
    // new job drops it, its id then 404) with the video model's stages joining a
    // shared [budget], and a clean exit after.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("videos.toml");
    let text = format!(
        "[limits]\nmax_video_jobs = 1\n\n\
         [budget]\nvram_budget = \"64MiB\"\npin_ceiling = \"64MiB\"\n\n\
         [[models]]\nname = \"{MODEL}\"\nfolder = \"{}\"\n",
        pipeline()
    );
    std::fs::write(&config, text).unwrap();
    let server = Server::start(&["--config", &config.display().to_string()]);
    let first = server.post("/v1/videos", &small("a longer video", 8));
    assert_eq!(first.status, 200, "{}", first.text());
    let first_id = first.json()["id"].as_str().expect("an id").to_string();
    let refused = server.post("/v1/videos", &small("one too many", 1));
    refused.assert_error(429, "limits.max_video_jobs");
    assert!(
        refused.header("retry-after").is_some(),
        "{:?}",
        refused.headers
    );
    assert_eq!(finished(&server, &first_id)["status"], "completed");
    let second = server.post("/v1/videos", &small("now there is room", 1));
    assert_eq!(second.status, 200, "{}", second.text());
    server
        .get(&format!("/v1/videos/{first_id}"))
        .assert_error(404, "limits.max_video_jobs");
    let second_id = second.json()["id"].as_str().expect("an id").to_string();
    assert_eq!(finished(&server, &second_id)["status"], "completed");
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}

/// A `multipart/form-data` body of boundary `b`, as httpx writes the openai client's:
/// text `fields`, then the file part `(name, content type, bytes)` when given.
fn form(fields: &[(&str, &str)], file: Option<(&str, &str, &[u8])>) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, value) in fields {
        let part =
            format!("--b\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n");
        body.extend_from_slice(part.as_bytes());
    }
    if let Some((name, content_type, bytes)) = file {
        let head = format!("--b\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"first.png\"\r\nContent-Type: {content_type}\r\n\r\n");
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"--b--\r\n");
    body
}

fn post_form(server: &Server, body: &[u8]) -> Reply {
    let headers = [("Content-Type", "multipart/form-data; boundary=b")];
    server.request("POST", "/v1/videos", &headers, Some(body))
}

/// The small video's fields for `model`, as a form sends them.
fn small_fields(model: &str) -> Vec<(&str, &str)> {
    vec![
        ("model", model),
        ("prompt", "the fox turns its head"),
        ("size", "48x64"),
        ("seconds", "0.25"),
        ("num_inference_steps", "2"),
        ("max_sequence_length", "16"),
        ("guidance_scale", "1"),
        ("seed", "3"),
    ]
}

/// An 8-bit RGB PNG of `width` × `height`, black.
fn black_png(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().expect("a header");
    let pixels = vec![0; (3 * width * height) as usize];
    writer.write_image_data(&pixels).expect("the pixels");
    writer.finish().expect("written");
    bytes
}

#[test]
fn an_image_to_video_model_makes_the_pipelines_video_of_the_image_sent() {
    // Proves issue 41's image-to-video over HTTP: the fixture's first.png sent as the
    // input_reference file part (as the openai client sends it) makes a job that
    // completes, and its MP4 is byte for byte the one the pipeline makes in-process
    // from the same image and request; the same request with another image makes
    // another video.
    let folder = fixture(I2V_MODEL);
    let server = Server::start(&["--model", &folder.display().to_string()]);
    let first = std::fs::read(folder.join("first.png")).expect("first.png");
    let fields = small_fields(I2V_MODEL);
    let created = post_form(
        &server,
        &form(&fields, Some(("input_reference", "image/png", &first))),
    );
    assert_eq!(created.status, 200, "{}", created.text());
    let id = created.json()["id"].as_str().expect("an id").to_string();
    let last = std::fs::read(folder.join("last.png")).expect("last.png");
    let other = post_form(
        &server,
        &form(&fields, Some(("input_reference", "image/png", &last))),
    );
    assert_eq!(other.status, 200, "{}", other.text());
    let other_id = other.json()["id"].as_str().expect("an id").to_string();
    let done = finished(&server, &id);
    assert_eq!(done["status"], "completed", "{done}");
    let mp4 = server.get(&format!("/v1/videos/{id}/content"));
    assert_eq!(mp4.status, 200, "{}", mp4.text());
    assert_eq!(&mp4.body[4..8], b"ftyp", "an MP4 starts with its ftyp box");
    assert_eq!(finished(&server, &other_id)["status"], "completed");
    let other_mp4 = server.get(&format!("/v1/videos/{other_id}/content"));
    assert_ne!(mp4.body, other_mp4.body, "the image changed nothing");
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);

    let parts = stagehand::pipeline::WanParts::folder(&folder).expect("a Wan I2V pipeline");
    let image = stagehand::pipeline::png_rgb(std::io::Cursor::new(&first), [48, 64]);
    let request = stagehand::pipeline::VideoRequest {
        prompt: "the fox turns its head".into(),
        negative_prompt: String::new(),
        width: 48,
        height: 64,
        frames: 5,
        steps: 2,
        guidance: 1.0,
        guidance_2: None,
        seed: 3,
        latents: None,
        max_sequence_length: 16,
        image: Some(image.expect("first.png reads")),
        last_image: None,
        vae_tile: None,
        hand_over_prefetch: true,
    };
    let settings = stagehand::settings::Settings::default();
    let run = stagehand::pipeline::PipelineRun::quiet(&settings);
    let video = stagehand::pipeline::generate_video(&parts, &request, &run).expect("a video");
    let expected = stagehand::pipeline::mp4_bytes(&video.frames, 16).expect("an MP4");
    assert!(mp4.body == expected, "the served MP4 is not the pipeline's");
}

#[test]
fn an_image_the_model_cannot_take_is_refused_naming_input_reference() {
    // Proves the image's refusals before any job is queued: an image-to-video model
    // without its image, a text-to-video model given one, an image of another size
    // (both sizes named), a file that is not a PNG, a file part of another name, and
    // an image past limits.max_input_reference_bytes (413) in a body the route takes
    // although it is past limits.max_body_bytes, and a body past the route's limit.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("videos.toml");
    let text = format!(
        "[limits]\nmax_body_bytes = 4096\nmax_input_reference_bytes = 6000\n\n\
         [[models]]\nname = \"{I2V_MODEL}\"\nfolder = \"{}\"\n\n\
         [[models]]\nname = \"{MODEL}\"\nfolder = \"{}\"\n",
        fixture(I2V_MODEL).display(),
        pipeline()
    );
    std::fs::write(&config, text).unwrap();
    let server = Server::start(&["--config", &config.display().to_string()]);
    let i2v = small_fields(I2V_MODEL);
    let t2v = small_fields(MODEL);
    let fitting = black_png(48, 64);
    let refused = |fields: &[(&str, &str)], file: Option<(&str, &str, &[u8])>, status, needle| {
        let reply = post_form(&server, &form(fields, file));
        let body = reply.assert_error(status, needle);
        assert_eq!(body["error"]["param"], "input_reference", "{body}");
    };
    refused(&i2v, None, 400, "the image is required");
    let png = ("input_reference", "image/png", &fitting[..]);
    refused(&t2v, Some(png), 400, "takes no input_reference");
    let small = black_png(16, 16);
    let wrong = ("input_reference", "image/png", &small[..]);
    refused(
        &i2v,
        Some(wrong),
        400,
        "is 16x16, the video's size is 48x64",
    );
    let gif = (
        "input_reference",
        "image/gif",
        &b"GIF89a\x01\x00\x01\x00"[..],
    );
    refused(&i2v, Some(gif), 400, "first.png, image/gif) is not a PNG");
    let first = std::fs::read(fixture(I2V_MODEL).join("first.png")).expect("first.png");
    // Past the image's limit, and with the fields within the route's body limit
    // (4096 + 8000: the image's allowance as base64) though past max_body_bytes.
    assert!((6000..11_000).contains(&first.len()), "{}", first.len());
    let large = ("input_reference", "image/png", &first[..]);
    refused(
        &i2v,
        Some(large),
        413,
        "limits.max_input_reference_bytes = 6000",
    );
    let past = vec![0; 12_100];
    let whole = post_form(
        &server,
        &form(&i2v, Some(("input_reference", "image/png", &past))),
    );
    whole.assert_error(
        413,
        "for a video request, 12096 bytes (limits.max_body_bytes = 4096",
    );
    let reply = post_form(
        &server,
        &form(&i2v, Some(("image", "image/png", &fitting[..]))),
    );
    reply.assert_error(400, "only as input_reference");
    assert_eq!(
        server.get("/v1/videos").json()["data"],
        json!([]),
        "a refused request left a job"
    );
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}
