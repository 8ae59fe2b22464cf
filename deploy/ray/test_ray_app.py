"""The Ray Serve application end to end on this machine's CPU (issue 42): a local Ray
cluster, two CPU replicas each supervising a release `stagehand serve` with its own
model set (replica 0: the encoder `bert`; replica 1: the decoder `llama`), the
official `openai` client through the ingress.

Proves, in order:
1. each model's answers through the ingress equal the same request to a lone
   `serve` (embeddings within 1e-6, greedy completions and chat word for word), and
   a streamed completion passes its server-sent events through (same text);
2. requests go to the replica where their model is resident: each replica's own
   /metrics counts every request for its model and none for the other's, and the
   ingress found the model on its first try for >= 95 % of them;
3. a full queue's 429 reaches the client with its Retry-After;
4. killing a replica's process mid-load loses no request: each is answered 200 (asked
   again until the replacement holds the model) or 503 with Retry-After, never
   dropped; its failing /ready makes Ray replace the replica, and the model answers
   again from the new one;
5. removing the application drains every replica: each process exits 0 with both
   budgets at zero;
6. with autoscaling on ongoing requests, queue pressure scales 1 replica to 2;
7. SIGTERM of `python -m stagehand_ray` lets a stream in flight finish (`data:
   [DONE]`), drains every replica (exit 0, budgets zero) and exits 0.

Usage: DEPLOY_STAGEHAND_BIN=target/release/stagehand python deploy/ray/test_ray_app.py
(not STAGEHAND_*: serve reads every STAGEHAND_ variable as a setting and refuses
unknown ones)
(scripts/deploy-check.sh builds the binary and the venv). Exits 0 when every check
passes; prints each figure it checked."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ROOT = HERE.parents[1]
BINARY = os.environ.get("DEPLOY_STAGEHAND_BIN") or str(
    Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "stagehand"
)
# Bounds: every wait in this file has one.
START_S = 180
SCALE_S = 120
REPLACE_S = 120
REQUEST_S = 60
# A VRAM budget each tiny model fits in whole: resident (the default, 40 % of the
# model, streams most of it).
ROOMY = "64MiB"


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
    print(f"  ok: {message}", flush=True)


def demo_models(directory: Path) -> dict[str, Path]:
    """A tiny BERT and a tiny Llama from `stagehand demo-model`; the decoder without
    an end-of-text id, so a long generation runs to its max_tokens."""
    folders = {}
    for name, arch in (("bert", "bert"), ("llama", "llama")):
        folder = directory / name
        subprocess.run([BINARY, "demo-model", "--arch", arch, "--out", str(folder)],
                       check=True, stdout=subprocess.DEVNULL)
        folders[name] = folder
    config_path = folders["llama"] / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("eos_token_id", None)
    config_path.write_text(json.dumps(config))
    return folders


def http(url: str, body: dict | None = None, timeout: float = REQUEST_S) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def http_patient(url: str, body: dict) -> tuple[int, dict, bytes]:
    """As a client should: a 429 is asked again after its Retry-After (at most 60 times)."""
    for _ in range(60):
        status, headers, content = http(url, body)
        if status != 429:
            return status, headers, content
        time.sleep(float(headers.get("retry-after") or headers.get("Retry-After") or 1))
    return status, headers, content


def metric(text: str, name: str, labels: dict[str, str]) -> float:
    """The sum of `name`'s series carrying `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def replicas(state_dir: Path) -> list[dict]:
    out = []
    for path in sorted(state_dir.glob("replica-*.json")):
        state = json.loads(path.read_text())
        state["tag"] = path.stem[len("replica-"):]
        out.append(state)
    return out


def wait_for(what: str, condition, timeout_s: float, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def app_config(folders: dict[str, Path], state_dir: Path, **extra) -> dict:
    config = {
        "binary": BINARY,
        "state_dir": str(state_dir),
        "gpus_per_replica": 0,  # CPU replicas: this machine has no GPU
        "cpus_per_replica": 0.5,
        "serve": {"limits": {"drain_seconds": 5, "queue_depth": 2, "max_tokens": 4000}},
        "model_sets": [
            [{"name": "bert", "folder": str(folders["bert"]), "vram_budget": ROOMY}],
            [{"name": "llama", "folder": str(folders["llama"]), "vram_budget": ROOMY, "max_sequences": 1}],
        ],
        "num_replicas": 2,
    }
    config.update(extra)
    return config


def lone_answers(folders: dict[str, Path], workdir: Path, requests: list[tuple[str, dict]]) -> list[dict]:
    """The same requests to one `stagehand serve` holding both models."""
    from stagehand_ray.process import ServeProcess

    # Default budgets here (40 % of each model: streamed), roomy ones behind Ray
    # (resident): the answers must not depend on where the weights sit.
    process = ServeProcess(BINARY, {"models": [
        {"name": "bert", "folder": str(folders["bert"])},
        {"name": "llama", "folder": str(folders["llama"])},
    ]}, workdir)
    process.start(START_S)
    try:
        answers = []
        for path, body in requests:
            status, _, content = http(process.url + path, body)
            assert status == 200, content
            answers.append(json.loads(content))
        return answers
    finally:
        report = process.stop(30)
        assert report.exit_code == 0 and report.budgets_zero, report.to_json()


def answers_equal_a_lone_serve(client, folders, workdir) -> None:
    print("1. answers through the ingress equal a lone serve's", flush=True)
    texts = ["a man is eating food", "the cat sits outside", "hello"]
    requests = [
        ("/v1/embeddings", {"model": "bert", "input": texts}),
        ("/v1/completions", {"model": "llama", "prompt": "hello", "max_tokens": 12, "temperature": 0}),
        ("/v1/chat/completions", {"model": "llama", "max_tokens": 10, "temperature": 0,
                                  "messages": [{"role": "user", "content": "hi there"}]}),
    ]
    lone = lone_answers(folders, workdir, requests)
    embedded = client.embeddings.create(model="bert", input=texts, encoding_format="float")
    worst = max(abs(a - b) for got, want in zip(embedded.data, lone[0]["data"])
                for a, b in zip(got.embedding, want["embedding"]))
    check(len(embedded.data) == 3 and worst <= 1e-6, f"embeddings equal (largest difference {worst:.2e})")
    completion = client.completions.create(model="llama", prompt="hello", max_tokens=12, temperature=0)
    want = lone[1]["choices"][0]["text"]
    check(completion.choices[0].text == want, f"greedy completion equal: {want!r}")
    chat = client.chat.completions.create(model="llama", max_tokens=10, temperature=0,
                                          messages=[{"role": "user", "content": "hi there"}])
    check(chat.choices[0].message.content == lone[2]["choices"][0]["message"]["content"], "chat answer equal")
    chunks = list(client.completions.create(model="llama", prompt="hello", max_tokens=12,
                                            temperature=0, stream=True))
    streamed = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    check(len(chunks) > 2 and streamed == want, f"streamed through as {len(chunks)} events, same text")


def routed_to_where_resident(base_url: str, state_dir: Path, count: int) -> None:
    print("2. each request goes to the replica where its model is resident", flush=True)
    before = {r["tag"]: http(f"http://{r['addr']}/metrics")[2].decode() for r in replicas(state_dir)}
    stats_before = json.loads(http(base_url + "/ingress/stats")[2])
    bodies = []
    for index in range(count):
        bodies.append(("/v1/embeddings", {"model": "bert", "input": f"text number {index}"}))
        bodies.append(("/v1/completions", {"model": "llama", "prompt": f"p{index}", "max_tokens": 4}))
    # The decoder takes one sequence and queues two: the rest are 429s, asked again.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda pb: http_patient(base_url + pb[0], pb[1])[0], bodies))
    check(statuses.count(200) == len(bodies), f"{len(bodies)} mixed requests answered 200: {statuses}")
    for state in replicas(state_dir):
        text = http(f"http://{state['addr']}/metrics")[2].decode()
        for model in ("bert", "llama"):
            answered = (metric(text, "stagehand_serve_requests_total", {"model": model, "outcome": "ok"})
                        - metric(before[state["tag"]], "stagehand_serve_requests_total",
                                 {"model": model, "outcome": "ok"}))
            expected = count if model in state["models"] else 0
            check(answered == expected,
                  f"replica {state['rank']} ({state['models']}) answered {answered:.0f} {model} requests")
        residency = json.loads(http(f"http://{state['addr']}/residency")[2])
        check(all(m["state"] == "resident" for m in residency["models"]),
              f"replica {state['rank']}: its models are resident")
    stats = json.loads(http(base_url + "/ingress/stats")[2])
    routed = stats["requests"] - stats_before["requests"]
    first = stats["first_attempt_here"] - stats_before["first_attempt_here"]
    check(routed >= len(bodies) and first / routed >= 0.95,
          f"first try on the replica holding the model: {first}/{routed} ({100 * first / routed:.1f} %; "
          f"{routed - len(bodies)} were 429s asked again)")


def tokens_lasting(base_url: str, seconds: float) -> int:
    """How many greedy llama tokens one request generates in about `seconds` with this
    binary on this machine. The long requests below are sized by time, not by count:
    a debug build (CI runs this test on the suite's debug binary) decodes several
    times slower than a release one, and a request must be in flight when the test
    acts on it yet end well within REQUEST_S."""
    probe = 200
    started = time.monotonic()
    status, _, _ = http(base_url + "/v1/completions", {"model": "llama", "prompt": "t", "max_tokens": probe})
    elapsed = time.monotonic() - started
    check(status == 200, f"a {probe}-token request took {elapsed:.2f} s")
    # At most 2600: the longest request below asks 1.5 times this, under max_tokens 4000.
    return min(2600, max(20, int(seconds * probe / elapsed)))


def full_queue_passes_429(base_url: str) -> None:
    print("3. a full queue's 429 reaches the client with Retry-After", flush=True)
    long_body = {"model": "llama", "prompt": "a", "max_tokens": 4000, "stream": True}
    request = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(long_body).encode(),
                                     headers={"content-type": "application/json"})
    running = urllib.request.urlopen(request, timeout=REQUEST_S)
    running.readline()  # the generation has begun: the decoder's one sequence is taken
    pool = concurrent.futures.ThreadPoolExecutor(6)
    try:
        short = {"model": "llama", "prompt": "b", "max_tokens": 2}
        futures = [pool.submit(http, base_url + "/v1/completions", short) for _ in range(6)]
        # Two wait in the queue behind the running generation; the rest come back.
        concurrent.futures.wait(futures, timeout=REQUEST_S, return_when=concurrent.futures.FIRST_COMPLETED)
        wait_for("the refused requests", lambda: sum(f.done() for f in futures) >= 4, REQUEST_S, 0.1)
    finally:
        running.close()  # the client hangs up: its sequence is cancelled, the queue runs
    answers = [future.result() for future in futures]
    pool.shutdown()
    refused = [headers for status, headers, _ in answers if status == 429]
    retry_after = {h.get("retry-after") or h.get("Retry-After") for h in refused}
    statuses = sorted(status for status, _, _ in answers)
    check(len(refused) == 4 and retry_after == {"1"} and statuses == [200, 200, 429, 429, 429, 429],
          f"6 requests behind a running one with a queue of 2: {statuses}, Retry-After {retry_after}")


def killed_replica_loses_nothing(base_url: str, state_dir: Path, long_tokens: int) -> str:
    print("4. killing a replica's process mid-load: every request answered; the replica replaced", flush=True)
    (victim,) = [r for r in replicas(state_dir) if "llama" in r["models"]]
    # One runs, two wait in its queue, the others are 429s asked again: all in flight
    # for seconds (about 2 s each, one sequence at a time) when the process dies.
    body = {"model": "llama", "prompt": "x", "max_tokens": long_tokens}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(http_patient, base_url + "/v1/completions", body) for _ in range(8)]
        time.sleep(0.5)
        os.kill(victim["pid"], signal.SIGKILL)
        answers = [future.result() for future in futures]
    statuses = sorted(status for status, _, _ in answers)
    unavailable_ok = all((h.get("retry-after") or h.get("Retry-After")) == "1"
                         for status, h, _ in answers if status == 503)
    check(set(statuses) <= {200, 503} and unavailable_ok,
          f"8 requests in flight answered {statuses} (503s with Retry-After)")
    replacement = wait_for("a replacement llama replica", lambda: [
        r for r in replicas(state_dir) if "llama" in r["models"] and r["tag"] != victim["tag"]], REPLACE_S)
    check(bool(replacement), f"Ray replaced replica {victim['tag']} with {replacement[0]['tag']}")
    status = wait_for("llama to answer again", lambda: http(
        base_url + "/v1/completions", {"model": "llama", "prompt": "y", "max_tokens": 2})[0] == 200, REPLACE_S)
    check(status, "the decoder answers from the new replica")
    return victim["tag"]


def drained(state_dir: Path, skip: set[str]) -> None:
    reports = {}
    for state in replicas(state_dir):
        if state["tag"] in skip:
            continue
        path = state_dir / f"drain-{state['tag']}.json"
        reports[state["tag"]] = wait_for(f"the drain report of {state['tag']}",
                                         lambda p=path: p.exists() and json.loads(p.read_text()), 60)
    for tag, report in reports.items():
        check(report["exit_code"] == 0 and report["budgets_zero"],
              f"replica {tag} drained: exit {report['exit_code']}, held {report['models']}")


def scales_under_queue_pressure(serve, build_app, folders, state_dir: Path, port: int,
                                long_tokens: int) -> None:
    print("6. autoscaling on ongoing requests: 1 replica becomes 2 under queue pressure", flush=True)
    config = app_config(folders, state_dir, autoscaling={
        "min_replicas": 1, "max_replicas": 2, "initial_replicas": 1, "target_ongoing_requests": 1,
        "upscale_delay_s": 1, "downscale_delay_s": 600, "metrics_interval_s": 0.5, "look_back_period_s": 2,
    })
    config.pop("num_replicas")
    config["model_sets"] = [[{"name": "bert", "folder": str(folders["bert"]), "vram_budget": ROOMY},
                             {"name": "llama", "folder": str(folders["llama"]), "vram_budget": ROOMY, "max_sequences": 4}]]
    config["serve"]["limits"]["queue_depth"] = 16
    serve.run(build_app({"config": config}), name="stagehand", route_prefix="/")

    def running() -> int:
        status = serve.status().applications["stagehand"].deployments["StagehandReplica"]
        return status.replica_states.get("RUNNING", 0)

    check(running() == 1, "starts with 1 replica")
    base_url = f"http://127.0.0.1:{port}"
    body = {"model": "llama", "prompt": "z", "max_tokens": long_tokens * 3 // 2}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(http, base_url + "/v1/completions", body, 240) for _ in range(8)]
        started = time.monotonic()
        wait_for("a second replica", lambda: running() >= 2, SCALE_S)
        scaled_s = time.monotonic() - started
        statuses = [future.result()[0] for future in futures]
    check(running() == 2, f"scaled to 2 replicas {scaled_s:.1f} s into the load")
    check(statuses.count(200) == 8, f"the 8 long requests answered {statuses}")


def sigterm_of_the_launcher_drains(folders, work: Path, long_tokens: int) -> None:
    print("7. SIGTERM of `python -m stagehand_ray`: the stream in flight ends, every replica drains", flush=True)
    import yaml

    state_dir = work / "launched"
    config = app_config(folders, state_dir)
    path = work / "launched.yaml"
    path.write_text(yaml.safe_dump(config))
    port = int(os.environ.get("DEPLOY_RAY_PORT", "18642")) + 1
    launcher = subprocess.Popen(
        [sys.executable, "-m", "stagehand_ray", str(path), "--port", str(port), "--num-cpus", "4"],
        cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        deadline = time.monotonic() + START_S
        while "listening on" not in line and time.monotonic() < deadline and launcher.poll() is None:
            line = launcher.stdout.readline()
        check("listening on" in line, f"the launcher serves: {line.strip()}")
        body = {"model": "llama", "prompt": "s", "max_tokens": long_tokens // 2, "stream": True}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        stream = urllib.request.urlopen(request, timeout=REQUEST_S)
        stream.readline()  # the generation has begun
        launcher.send_signal(signal.SIGTERM)
        rest = stream.read().decode()
        check(rest.rstrip().endswith("data: [DONE]"), "the stream in flight ran to data: [DONE]")
        code = launcher.wait(120)
        check(code == 0, f"the launcher exited {code}")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    drained(state_dir, skip=set())


def main() -> int:
    if not Path(BINARY).is_file():
        print(f"no stagehand binary at {BINARY}: run `cargo build --release` first", file=sys.stderr)
        return 2
    import openai
    import ray
    from ray import serve

    from stagehand_ray.app import build_app

    work = Path(tempfile.mkdtemp(prefix="stagehand-ray-test-"))
    folders = demo_models(work / "models")
    port = int(os.environ.get("DEPLOY_RAY_PORT", "18642"))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}})
    started = time.monotonic()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        state_dir = work / "state"
        serve.run(build_app({"config": app_config(folders, state_dir)}), name="stagehand", route_prefix="/")
        wait_for("two replicas", lambda: len(replicas(state_dir)) == 2, START_S)
        print(f"two replicas up in {time.monotonic() - started:.1f} s: "
              f"{[(r['rank'], r['models']) for r in replicas(state_dir)]}", flush=True)
        base_url = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_S)
        answers_equal_a_lone_serve(client, folders, work / "lone")
        routed_to_where_resident(base_url, state_dir, count=20)
        long_tokens = tokens_lasting(base_url, 2.0)
        full_queue_passes_429(base_url)
        victim = killed_replica_loses_nothing(base_url, state_dir, long_tokens)
        print("5. removing the application drains every replica", flush=True)
        serve.delete("stagehand")
        drained(state_dir, skip={victim})
        scaled_dir = work / "scaled"
        scales_under_queue_pressure(serve, build_app, folders, scaled_dir, port, long_tokens)
        serve.shutdown()
        drained(scaled_dir, skip=set())
    finally:
        ray.shutdown()
    sigterm_of_the_launcher_drains(folders, work, long_tokens)
    print(f"all checks passed in {time.monotonic() - started:.1f} s")
    shutil.rmtree(work, ignore_errors=True)  # kept when a check fails, for its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
