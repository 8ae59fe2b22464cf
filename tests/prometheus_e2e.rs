//! End to end against a real Prometheus: a live `stagehand run --steps 0` serving
//! `/metrics` on loopback is scraped by Debian's `prometheus` (installed by
//! `scripts/install-prometheus.sh`), loaded with `dashboards/rules.yml`; the test queries
//! the HTTP API for moved bytes and for every dashboard expression, lints a live scrape
//! with `promtool check metrics`, checks every rule
//! evaluates cleanly, then interrupts stagehand and expects a clean exit.
//!
//! If prometheus cannot be started the test fails and says why: it never passes
//! silently. Every wait is bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use stagehand::telemetry::promql;

const STAGEHAND: &str = env!("CARGO_BIN_EXE_stagehand");
/// Debug builds, a cold page cache and a busy 2-core machine make start-up slow.
const START_TIMEOUT: Duration = Duration::from_secs(90);
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A free loopback port. The tiny race between probing and the child binding it is
/// acceptable in a test; a collision fails loudly, not silently.
fn free_port() -> SocketAddr {
    let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe port on loopback");
    probe.local_addr().expect("probe address")
}

/// A child process that is killed if the test ends early, with its output in a file.
struct Running {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl Running {
    fn spawn(name: &'static str, command: &mut Command, log: PathBuf) -> Result<Self, String> {
        let out = std::fs::File::create(&log).map_err(|error| error.to_string())?;
        let err = out.try_clone().map_err(|error| error.to_string())?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|error| format!("cannot start {name}: {error}"))?;
        Ok(Self {
            name,
            child: Some(child),
            log,
        })
    }

    fn log(&self) -> String {
        read_log(&self.log)
    }

    fn pid(&self) -> libc::pid_t {
        let child = self.child.as_ref().expect("child still owned");
        libc::pid_t::try_from(child.id()).expect("pid fits pid_t")
    }

    /// Panics with the child's log if it has already exited.
    fn assert_alive(&mut self) {
        let child = self.child.as_mut().expect("child still owned");
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{} exited early with {status}; its output:\n{}",
                self.name,
                self.log()
            );
        }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on the pid of a child we spawned and have not yet reaped.
        let result = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(result, 0, "kill({}, {signal}) failed", self.name);
    }

    /// Waits, bounded, for the child to exit and returns its status.
    fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().expect("child still owned");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| format!("(no log: {error})"))
}

/// A plain HTTP/1.0 GET; returns the status code and the body.
fn http_get(addr: SocketAddr, target: &str) -> Result<(u16, String), String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(|error| error.to_string())?;
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .map_err(|error| error.to_string())?;
    write!(stream, "GET {target} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|error| error.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|error| error.to_string())?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP response: {response:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Runs an instant query; returns the whole JSON answer (success or error).
fn query(prometheus: SocketAddr, expression: &str) -> Result<Value, String> {
    let target = format!("/api/v1/query?query={}", percent_encode(expression));
    let (_, body) = http_get(prometheus, &target)?;
    serde_json::from_str(&body).map_err(|error| format!("{error}: {body}"))
}

/// Polls until `ready` returns `Some`, or panics after `timeout` with `what` and context.
fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A live scrape of stagehand's own `/metrics` passes `promtool check metrics` with no lint.
fn assert_lint_clean(metrics_addr: SocketAddr) {
    let (status, body) = http_get(metrics_addr, "/metrics").expect("scrape stagehand");
    assert_eq!(status, 200);
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!("cannot run promtool ({error}); install it with scripts/install-prometheus.sh")
        });
    let mut stdin = promtool.stdin.take().expect("piped stdin");
    stdin.write_all(body.as_bytes()).expect("feed promtool");
    drop(stdin);
    let output = promtool.wait_with_output().expect("promtool finished");
    let lint = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && lint.trim().is_empty(),
        "promtool check metrics on a live scrape: {}\n{lint}\nscrape:\n{body}",
        output.status
    );
}

fn dashboard_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_path("dashboards/stagehand.json"))
        .expect("read dashboards/stagehand.json");
    let dashboard: Value = serde_json::from_str(&text).expect("dashboard is valid JSON");
    let mut expressions = Vec::new();
    let mut pending: Vec<&Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    while let Some(panel) = pending.pop() {
        pending.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expression) = target["expr"].as_str() {
                expressions.push((panel["title"].to_string(), expression.to_string()));
            }
        }
    }
    expressions
}

#[test]
fn a_real_prometheus_scrapes_a_live_run_and_every_dashboard_query_succeeds() {
    // Proves the whole path — live run, /metrics, scrape, rules, dashboard PromQL — works
    // against the real tools, and that an interrupted run exits cleanly.
    let directory = tempfile::tempdir().expect("temp dir");
    let metrics_addr = free_port();
    let mut stagehand = Running::spawn(
        "stagehand",
        Command::new(STAGEHAND)
            .args([
                "run",
                "--steps",
                "0",
                "--metrics-addr",
                &metrics_addr.to_string(),
            ])
            .env("XDG_CACHE_HOME", directory.path().join("cache"))
            .env("STAGEHAND_LOG", "info"),
        directory.path().join("stagehand.log"),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    let stagehand_log = stagehand.log.clone();
    wait_for(
        "stagehand to serve /metrics",
        START_TIMEOUT,
        || {
            stagehand.assert_alive();
            match http_get(metrics_addr, "/metrics") {
                Ok((200, body)) if body.contains("stagehand_") => Some(()),
                _ => None,
            }
        },
        || read_log(&stagehand_log),
    );

    let prometheus_addr = free_port();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: stagehand\n    static_configs:\n      - targets: ['{metrics_addr}']\n",
        rules = repo_path("dashboards/rules.yml").display()
    );
    let config_path = directory.path().join("prometheus.yml");
    std::fs::write(&config_path, config).expect("write prometheus.yml");
    let storage = directory.path().join("tsdb");
    let mut prometheus = Running::spawn(
        "prometheus",
        Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", storage.display()))
            .arg(format!("--web.listen-address={prometheus_addr}")),
        directory.path().join("prometheus.log"),
    )
    .unwrap_or_else(|error| {
        panic!("{error}; install it with scripts/install-prometheus.sh (Debian's prometheus)")
    });
    let prometheus_log = prometheus.log.clone();
    wait_for(
        "prometheus to become ready",
        START_TIMEOUT,
        || {
            prometheus.assert_alive();
            matches!(http_get(prometheus_addr, "/-/ready"), Ok((200, _))).then_some(())
        },
        || read_log(&prometheus_log),
    );

    let scrape_context = || format!("prometheus log:\n{}", read_log(&prometheus_log));
    wait_for(
        "a successful scrape of stagehand",
        SCRAPE_TIMEOUT,
        || {
            let answer = query(prometheus_addr, r#"up{job="stagehand"} == 1"#).ok()?;
            let results = answer["data"]["result"].as_array()?;
            (!results.is_empty()).then_some(())
        },
        scrape_context,
    );
    let moved_bytes = wait_for(
        "moved bytes > 0 in Prometheus",
        SCRAPE_TIMEOUT,
        || {
            let answer = query(
                prometheus_addr,
                r#"sum({__name__=~"stagehand_.*bytes.*_total", job="stagehand"}) > 0"#,
            )
            .ok()?;
            let value = answer["data"]["result"][0]["value"][1].as_str()?;
            value.parse::<f64>().ok()
        },
        || format!("stagehand log:\n{}", read_log(&stagehand_log)),
    );
    assert!(moved_bytes > 0.0);
    assert_lint_clean(metrics_addr);
    // Rates need two samples of the same series; three scrapes leave margin.
    wait_for(
        "three scrapes",
        SCRAPE_TIMEOUT,
        || {
            let answer = query(
                prometheus_addr,
                r#"count_over_time(up{job="stagehand"}[1m]) >= 3"#,
            )
            .ok()?;
            (!answer["data"]["result"].as_array()?.is_empty()).then_some(())
        },
        scrape_context,
    );

    let expressions = dashboard_expressions();
    assert!(!expressions.is_empty(), "the dashboard has no queries");
    for (panel, expression) in &expressions {
        let runnable = promql::substitute_grafana_variables(expression, "30s");
        let answer = query(prometheus_addr, &runnable)
            .unwrap_or_else(|error| panic!("panel {panel}: query failed: {error}"));
        assert_eq!(
            answer["status"], "success",
            "panel {panel}: {runnable}\nanswer: {answer}"
        );
    }

    // Every rule of dashboards/rules.yml was loaded and evaluates without error.
    let rules = wait_for(
        "the rules to be evaluated",
        SCRAPE_TIMEOUT,
        || {
            let (_, body) = http_get(prometheus_addr, "/api/v1/rules").ok()?;
            let answer: Value = serde_json::from_str(&body).ok()?;
            let rules: Vec<Value> = answer["data"]["groups"]
                .as_array()?
                .iter()
                .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            let evaluated = rules
                .iter()
                .all(|rule| rule["lastEvaluation"] != "0001-01-01T00:00:00Z");
            (evaluated && !rules.is_empty()).then_some(rules)
        },
        scrape_context,
    );
    assert_eq!(rules.len(), 7, "rules loaded: {rules:?}");
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "rule {} failed: {rule}", rule["name"]);
    }

    stagehand.signal(libc::SIGINT);
    let status = stagehand.wait(EXIT_TIMEOUT).unwrap_or_else(|| {
        panic!(
            "stagehand did not exit within {EXIT_TIMEOUT:?} of SIGINT; its output:\n{}",
            stagehand.log()
        )
    });
    // 128 + SIGINT: stopped by the signal, cleanly (the summary says every budget
    // was released).
    assert_eq!(
        status.code(),
        Some(130),
        "stagehand exited with {status} after SIGINT; its output:\n{}",
        stagehand.log()
    );
    assert!(
        stagehand
            .log()
            .contains("after shutdown: vram 0 B pinned 0 B held"),
        "budgets released: {}",
        stagehand.log()
    );
    prometheus.signal(libc::SIGTERM);
    assert!(
        prometheus.wait(EXIT_TIMEOUT).is_some(),
        "prometheus did not stop on SIGTERM"
    );
}
