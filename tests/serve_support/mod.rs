//! Shared by the serve tests: generated models, a running `stagehand serve` on a free
//! port, and a plain HTTP/1.1 client over a TCP socket (no client library between
//! the test and the server's bytes).
#![allow(dead_code)] // Each test binary uses a different subset.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::common::process::{send_signal, wait_or_kill, HANG};
use super::common::stagehand;

/// A tiny BERT encoder and a tiny Llama decoder (with its chat template) in `dir`.
pub fn models(dir: &Path) -> (PathBuf, PathBuf) {
    let bert = super::common::encoder::tiny_bert(&dir.join("bert"), stagehand::compute::DType::F32);
    let llama = super::common::decoder::tiny_decoder(
        &dir.join("llama"),
        stagehand::families::llama::DecoderArch::Llama,
        stagehand::compute::DType::F32,
        7,
    );
    (bert, llama)
}

/// `models`, with the decoder's end-of-text id removed from its `config.json`, so a
/// generation runs to its `max_tokens` (a test that needs one to last).
pub fn models_without_eos(dir: &Path) -> (PathBuf, PathBuf) {
    let (bert, llama) = models(dir);
    let path = llama.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("eos_token_id");
    std::fs::write(&path, config.to_string()).unwrap();
    (bert, llama)
}

/// A running server; killed if the test ends without stopping it.
pub struct Server {
    child: Option<Child>,
    pub addr: String,
    stdout: Option<std::thread::JoinHandle<Vec<String>>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

/// What a stopped server left: its exit status and output.
pub struct Stopped {
    pub status: ExitStatus,
    pub stdout: Vec<String>,
    pub stderr: String,
}

impl Server {
    /// `stagehand serve ARGS --bind 127.0.0.1:0 --log warn`, once it says where it listens.
    pub fn start(args: &[&str]) -> Server {
        let mut all = args.to_vec();
        all.extend(["--bind", "127.0.0.1:0", "--log", "warn"]);
        Server::start_exactly(&all)
    }

    /// `stagehand serve ARGS` (which must bind a free port), once it says where.
    pub fn start_exactly(args: &[&str]) -> Server {
        let mut child = stagehand()
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let mut stderr_pipe = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr_pipe.read_to_string(&mut text);
            text
        });
        let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        let _ = reader.read_line(&mut first);
        let Some(addr) = first
            .trim()
            .strip_prefix("stagehand serve: listening on http://")
        else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "serve did not start: {first:?}\nstderr: {}",
                stderr.join().unwrap_or_default()
            );
        };
        let addr = addr.to_string();
        let stdout = std::thread::spawn(move || reader.lines().map_while(Result::ok).collect());
        Server {
            child: Some(child),
            addr,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.request("POST", path, &[], Some(body.to_string().as_bytes()))
    }

    /// One request on its own connection (`Connection: close`), read to the end.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Reply {
        let mut stream = self.send(method, path, headers, body);
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).expect("read the response");
        Reply::parse(&bytes)
    }

    /// Sends a request and returns the open connection, for a test that reads part
    /// of a streamed answer (or none) and then hangs up.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> TcpStream {
        let mut stream = TcpStream::connect(&self.addr).expect("connect");
        stream.set_read_timeout(Some(HANG)).expect("timeout");
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(body) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).expect("send head");
        if let Some(body) = body {
            stream.write_all(body).expect("send body");
        }
        stream
    }

    /// Starts a streamed completion of `tokens` tokens of the served `llama` and
    /// returns the connection once its first chunk has arrived.
    pub fn streaming(&self, tokens: u64) -> TcpStream {
        let body = serde_json::json!({
            "model": "llama", "prompt": "hi", "max_tokens": tokens, "stream": true
        });
        let mut stream = self.send(
            "POST",
            "/v1/completions",
            &[],
            Some(body.to_string().as_bytes()),
        );
        let mut seen = Vec::new();
        let mut buffer = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains("data: {") {
            let read = stream.read(&mut buffer).expect("the stream answers");
            assert!(
                read > 0,
                "the stream ended early: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buffer[..read]);
        }
        stream
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends `signal` to the server.
    pub fn signal(&self, signal: i32) {
        send_signal(self.child.as_ref().expect("running"), signal);
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn stop(self) -> Stopped {
        self.signal(libc::SIGTERM);
        self.wait()
    }

    /// Waits for the exit (after a signal sent with [`Server::signal`]).
    pub fn wait(mut self) -> Stopped {
        let mut child = self.child.take().expect("running");
        let status = wait_or_kill(&mut child, HANG);
        Stopped {
            status,
            stdout: self
                .stdout
                .take()
                .map(|t| t.join().unwrap_or_default())
                .unwrap_or_default(),
            stderr: self
                .stderr
                .take()
                .map(|t| t.join().unwrap_or_default())
                .unwrap_or_default(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn parse(bytes: &[u8]) -> Reply {
        let split = bytes
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no end of headers in {:?}", String::from_utf8_lossy(bytes)));
        let head = String::from_utf8_lossy(&bytes[..split]).to_string();
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|code| code.parse().ok())
            .expect("a status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
            .collect();
        let raw = &bytes[split + 4..];
        let chunked = headers
            .iter()
            .any(|(name, value)| name == "transfer-encoding" && value.contains("chunked"));
        let body = if chunked { dechunk(raw) } else { raw.to_vec() };
        Reply {
            status,
            headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {}", self.text()))
    }

    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// Asserts an OpenAI error body with `status`, whose message contains `needle`.
    pub fn assert_error(&self, status: u16, needle: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        let body = self.json();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{needle:?} in {message:?}");
        assert!(body["error"]["type"].is_string(), "{body}");
        body
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let Some(end) = raw.windows(2).position(|window| window == b"\r\n") else {
            return body;
        };
        let size_text = String::from_utf8_lossy(&raw[..end]).to_string();
        let size = usize::from_str_radix(size_text.trim(), 16).unwrap_or(0);
        if size == 0 {
            return body;
        }
        let start = end + 2;
        body.extend_from_slice(&raw[start..(start + size).min(raw.len())]);
        raw = raw.get(start + size + 2..).unwrap_or_default();
    }
}

/// A sample of the text exposition whose name and labels match.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let samples = stagehand::telemetry::exposition::parse(text).expect("exposition parses");
    stagehand::telemetry::exposition::sum(&samples, name, labels)
}

/// Waits (bounded) until `check` holds, polling.
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !check() {
        assert!(started.elapsed() < HANG, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A serve config in `dir` with `bert` and `llama` sharing one `[budget]` that holds
/// about one and a half of them (three quarters of their weights together).
pub fn shared_budget_config(dir: &Path, bert: &Path, llama: &Path) -> PathBuf {
    shared_budget_config_with(dir, bert, llama, None)
}

/// [`shared_budget_config`], each model with an adapter `style` (`(bert, llama)`
/// files) requests can name as `bert:style` and `llama:style`.
pub fn shared_budget_config_with(
    dir: &Path,
    bert: &Path,
    llama: &Path,
    adapters: Option<(&Path, &Path)>,
) -> PathBuf {
    let weights = |folder: &Path| -> u64 {
        std::fs::read_dir(folder)
            .unwrap()
            .flatten()
            .filter(|entry| {
                entry
                    .path()
                    .extension()
                    .is_some_and(|ext| ext == "safetensors")
            })
            .map(|entry| entry.metadata().unwrap().len())
            .sum()
    };
    let shared = (weights(bert) + weights(llama)) * 3 / 4;
    let adapter = |file: Option<&Path>| {
        file.map_or(String::new(), |file| {
            format!("adapters = {{ style = \"{}\" }}\n", file.display())
        })
    };
    let text = format!(
        "[budget]\nvram_budget = \"{shared}B\"\npin_ceiling = \"{shared}B\"\n\n\
         [[models]]\nname = \"bert\"\nfolder = \"{}\"\n{}\n\
         [[models]]\nname = \"llama\"\nfolder = \"{}\"\n{}",
        bert.display(),
        adapter(adapters.map(|(bert, _)| bert)),
        llama.display(),
        adapter(adapters.map(|(_, llama)| llama)),
    );
    let path = dir.join("shared.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// PEFT adapters for the two models of [`models`], seeded with `seed`: `(bert, llama)`
/// adapter files, rank 4 on the attention projections of every layer — strong enough
/// that greedy answers change.
pub fn adapters(dir: &Path, seed: u64) -> (PathBuf, PathBuf) {
    let demo = stagehand::families::bert::BertDemo {
        preset: stagehand::families::bert::BertPreset::Tiny,
        dtype: stagehand::compute::DType::F32,
        ..Default::default()
    };
    let bert = stagehand::families::bert::write_bert_lora(
        &dir.join(format!("bert-lora-{seed}")),
        &demo,
        4,
        seed,
    )
    .unwrap();
    let ramp = |count: usize, scale: f32, salt: usize| -> Vec<f32> {
        (0..count)
            .map(|i| (((i + salt) * 7919 % 97) as f32 / 97.0 - 0.5) * scale)
            .collect()
    };
    let mut tensors = Vec::new();
    for layer in 0..4 {
        for (target, out) in [("q_proj", 128usize), ("v_proj", 64)] {
            let module = format!("base_model.model.model.layers.{layer}.self_attn.{target}");
            let salt = seed as usize * 13 + layer;
            tensors.push((
                format!("{module}.lora_A.weight"),
                vec![4, 128],
                ramp(4 * 128, 0.5, salt),
            ));
            tensors.push((
                format!("{module}.lora_B.weight"),
                vec![out, 4],
                ramp(out * 4, 2.0, salt + 5),
            ));
        }
    }
    let named: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(name, shape, values)| (name.as_str(), shape.clone(), values.clone()))
        .collect();
    let llama = dir.join(format!("llama-lora-{seed}.safetensors"));
    super::common::lora::write_f32_tensors(&llama, &named);
    (bert, llama)
}
