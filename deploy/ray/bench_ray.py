"""Two replicas against one through the Ray Serve ingress, on this machine's CPU: a
mixed load of embeddings (bert) and completions (llama), the same requests in the
same order for both layouts, in one invocation (the ratio is the figure; absolute
rates drift on a shared machine).

- one replica: a `stagehand serve` holding both models;
- two replicas: replica 0 holds bert, replica 1 llama.

Prints, per layout: requests per second, the share of requests the ingress found on
the replica holding their model at the first try, and whether each model was
resident there (from the replicas' /residency); and the load average around each.

Usage: DEPLOY_STAGEHAND_BIN=target/release/stagehand python deploy/ray/bench_ray.py
       [--requests N] [--clients C] [--tokens T]"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_ray_app import BINARY, ROOMY, START_S, demo_models, http, replicas, wait_for  # noqa: E402


def layout_config(folders, state_dir: Path, split: bool) -> dict:
    bert = {"name": "bert", "folder": str(folders["bert"]), "vram_budget": ROOMY}
    llama = {"name": "llama", "folder": str(folders["llama"]), "vram_budget": ROOMY, "max_sequences": 16}
    return {
        "binary": BINARY,
        "state_dir": str(state_dir),
        "gpus_per_replica": 0,
        "cpus_per_replica": 0.5,
        "serve": {"limits": {"drain_seconds": 5, "queue_depth": 256}},
        "model_sets": [[bert], [llama]] if split else [[bert, llama]],
        "max_ongoing_requests": 256,
    }


def workload(count: int, tokens: int) -> list[tuple[str, dict]]:
    bodies = []
    for index in range(count):
        if index % 2 == 0:
            bodies.append(("/v1/embeddings", {"model": "bert", "input": [f"sentence {index} {k}" for k in range(4)]}))
        else:
            bodies.append(("/v1/completions", {"model": "llama", "prompt": f"prompt {index}",
                                               "max_tokens": tokens, "temperature": 0}))
    return bodies


def measure(serve, build_app, config: dict, bodies, clients: int, port: int, expected: int) -> dict:
    state_dir = Path(config["state_dir"])
    serve.run(build_app({"config": config}), name="stagehand", route_prefix="/")
    wait_for("the replicas", lambda: len(replicas(state_dir)) == expected, START_S)
    base = f"http://127.0.0.1:{port}"
    for path, body in bodies[:4]:  # warm-up: every model used once
        http(base + path, body)
    before = json.loads(http(base + "/ingress/stats")[2])
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        statuses = list(pool.map(lambda pb: http(base + pb[0], pb[1], 300)[0], bodies))
    seconds = time.monotonic() - started
    load_after = os.getloadavg()[0]
    after = json.loads(http(base + "/ingress/stats")[2])
    states = {}
    for state in replicas(state_dir):
        residency = json.loads(http(f"http://{state['addr']}/residency")[2])
        states.update({m["id"]: m["state"] for m in residency["models"]})
    serve.delete("stagehand")
    routed = after["requests"] - before["requests"]
    first = after["first_attempt_here"] - before["first_attempt_here"]
    return {
        "replicas": expected,
        "ok": statuses.count(200),
        "requests": len(bodies),
        "seconds": seconds,
        "per_second": len(bodies) / seconds,
        "first_try_share": first / routed if routed else 0.0,
        "states": states,
        "load": (load_before, load_after),
    }


def direct(folders, workdir: Path, bodies, clients: int) -> dict:
    """The same load straight to one `stagehand serve` holding both models: what Ray's
    proxy and the ingress add."""
    from stagehand_ray.process import ServeProcess

    config = layout_config(folders, workdir, split=False)
    process = ServeProcess(BINARY, {"limits": config["serve"]["limits"], "models": config["model_sets"][0]},
                           workdir)
    process.start(START_S)
    try:
        for path, body in bodies[:4]:
            http(process.url + path, body)
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            statuses = list(pool.map(lambda pb: http(process.url + pb[0], pb[1], 300)[0], bodies))
        seconds = time.monotonic() - started
        load_after = os.getloadavg()[0]
    finally:
        process.stop(30)
    return {"replicas": "direct", "ok": statuses.count(200), "requests": len(bodies), "seconds": seconds,
            "per_second": len(bodies) / seconds, "first_try_share": 1.0, "states": {},
            "load": (load_before, load_after)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--port", type=int, default=18643)
    args = parser.parse_args()
    import ray
    from ray import serve

    from stagehand_ray.app import build_app

    work = Path(tempfile.mkdtemp(prefix="stagehand-ray-bench-"))
    folders = demo_models(work / "models")
    bodies = workload(args.requests, args.tokens)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        results = [direct(folders, work / "direct", bodies, args.clients)]
        print(json.dumps(results[0]), flush=True)
        for split, expected in ((False, 1), (True, 2), (False, 1), (True, 2)):
            config = layout_config(folders, work / f"state-{len(results)}", split)
            result = measure(serve, build_app, config, bodies, args.clients, args.port, expected)
            results.append(result)
            print(json.dumps(result), flush=True)
        serve.shutdown()
    finally:
        ray.shutdown()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"{args.requests} requests (half 4-text embeddings, half {args.tokens}-token completions), "
          f"{args.clients} clients")
    print("| replicas | requests/s | first try on the replica holding the model | states | load average |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['replicas']} | {r['per_second']:.1f} ({r['ok']}/{r['requests']} ok, {r['seconds']:.1f} s) | "
              f"{100 * r['first_try_share']:.1f} % | {r['states']} | {r['load'][0]:.1f} → {r['load'][1]:.1f} |")
    return 0 if all(r["ok"] == r["requests"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
