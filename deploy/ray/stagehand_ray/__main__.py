"""`python -m stagehand_ray CONFIG [--host H] [--port P] [--address RAY_ADDRESS]`:
starts (or joins) a Ray cluster, deploys the application of CONFIG on Ray Serve's
HTTP proxy, and on SIGTERM or SIGINT shuts Serve down — every replica's `stagehand
serve` drains and releases both budgets — and exits 0."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

import ray
from ray import serve

from .app import build_app, load_config


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m stagehand_ray")
    parser.add_argument("config", help="the deployment config (YAML; deploy/ray/example.yaml)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--address", default=None, help="a Ray cluster to join (default: start one here)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local cluster")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    stop = threading.Event()
    ray.init(address=args.address, num_cpus=args.num_cpus, include_dashboard=False,
             log_to_driver=False)
    # After ray.init: Ray's core worker installs its own SIGTERM handler (it aborts).
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_app({"config": config}), name="stagehand", route_prefix="/")
    print(f"stagehand on ray: listening on http://{args.host}:{args.port}", flush=True)
    stop.wait()
    print("stagehand on ray: draining every replica", flush=True)
    # The application first, with the HTTP proxy still up: Ray waits for each
    # replica's requests (streams included) before its __del__ drains the process.
    # serve.shutdown() alone stops the proxy at once, cutting streams in flight.
    serve.delete("stagehand")
    serve.shutdown()
    ray.shutdown()
    print("stagehand on ray: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
