"""stagehand on Ray Serve: one `stagehand serve` per replica (one GPU each), behind an
OpenAI-compatible ingress that routes each request to a replica where its model is
resident, with Ray Serve's own model multiplexing.

- `StagehandReplica` supervises one `stagehand serve` process (`process.py`). Its
  model set is `model_sets[rank % len(model_sets)]`, the rank being Ray Serve's
  replica rank, so replica 0 and replica 1 hold different models. At start it reads
  the process's `GET /residency` and registers every served model with Ray's
  multiplexer (cold first, resident last: the LRU keeps the resident ones), so Ray's
  router sends a request whose `multiplexed_model_id` is that model to this replica.
  A model of the `catalog` that no replica serves is loaded on demand through the
  process's `/admin/models` (and unloaded when the multiplexer evicts it).
- Ray's router falls back, for a model no replica has registered, to the replicas
  with the fewest models, then to any (power of two choices on queue length: the
  least loaded). A replica asked for a model it does not serve answers "not here",
  and the ingress asks again (counted: `GET /ingress/stats`), for up to
  `retry_seconds` (30), then answers 503 with Retry-After.
- `check_health` fails when the process has exited or `/ready` is not 200: Ray
  replaces the replica (a new process with the same model set).
- Autoscaling is Ray's, on ongoing requests per replica: a replica's ongoing
  requests are the process's queue plus what it computes (`target_ongoing_requests`).
- Shutdown (`serve.shutdown()`, `serve shutdown`, SIGTERM of `python -m
  stagehand_ray`): Ray stops routing to the replica, waits for its requests, then
  calls `__del__`, which SIGTERMs the process: it drains and exits 0 with both
  budgets at zero; the report is written to `state_dir` when one is set.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator, Optional

import aiohttp
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .process import ServeFailed, ServeProcess

logger = logging.getLogger("ray.serve")

# The endpoints routed by their body's `model`.
MODEL_PATHS = frozenset(
    ["/v1/embeddings", "/v1/completions", "/v1/chat/completions", "/v1/images/generations"]
)
# A replica's answer for a model it does not serve; the ingress asks again.
NOT_HERE = "x-stagehand-not-here"
# A replica's answer when its process did not take the request; safe to ask again.
NOT_TAKEN = "x-stagehand-not-taken"
# Headers of the process's answer that the ingress passes on.
PASSED_HEADERS = ("content-type", "retry-after", "cache-control")
STATES_LAST_RESIDENT = {"cold": 0, "streamed": 1, "resident": 2}


def error_body(message: str, kind: str, code: Optional[str] = None, param: Optional[str] = None) -> dict:
    """OpenAI's error shape, as `stagehand serve` answers."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def unavailable(message: str) -> JSONResponse:
    return JSONResponse(
        error_body(message, "service_unavailable", "unavailable"),
        status_code=503,
        headers={"retry-after": "1"},
    )


class ModelNotHere(LookupError):
    """This replica neither serves the model nor may load it."""


class ServedHere:
    """What the multiplexer caches for a model this replica serves. One loaded on
    demand is unloaded from the process when the multiplexer evicts it."""

    def __init__(self, replica: "StagehandReplica", model_id: str, on_demand: bool) -> None:
        self.replica = replica
        self.model_id = model_id
        self.on_demand = on_demand

    def __del__(self) -> None:
        # Called by the multiplexer on eviction (in a worker thread) and again by the
        # garbage collector: the unload goes to the replica's loop once.
        if self.on_demand:
            self.on_demand = False
            asyncio.run_coroutine_threadsafe(self.replica.unload(self.model_id), self.replica.loop)


@serve.deployment(
    name="StagehandReplica",
    # One GPU per replica; build_app sets 0 (CPU replicas) where the config says so.
    ray_actor_options={"num_gpus": 1},
    health_check_period_s=2,
    health_check_timeout_s=10,
    max_ongoing_requests=64,
)
class StagehandReplica:
    def __init__(self) -> None:
        self.process: Optional[ServeProcess] = None
        self.session: Optional[aiohttp.ClientSession] = None
        self.model_set: Optional[int] = None
        self.static: set[str] = set()
        self.catalog: dict[str, dict] = {}
        self.admin_key: Optional[str] = None
        self.config: dict = {}
        self.state_dir: Optional[Path] = None
        self.get_model = None
        self.switching = asyncio.Lock()
        self.tag = serve.get_replica_context().replica_tag

    async def reconfigure(self, config: dict, rank) -> None:
        """Starts the process with the model set of this replica's rank. Ray may give
        a replica another rank later (a replacement started before the replica it
        replaces released its rank is renumbered to keep ranks contiguous): then the
        process drains and a new one starts with the set of the new rank."""
        sets = config["model_sets"]
        index = rank.rank % len(sets)
        async with self.switching:
            if self.process is not None and index == self.model_set:
                return
            if self.process is not None:
                logger.info("rank %d: model set %s becomes %d", rank.rank, self.model_set, index)
                await self._stop(f"drain-{self.tag}-set{self.model_set}.json")
            self.config = config
            await self._start(index, rank.rank)

    async def _start(self, index: int, rank: int) -> None:
        config = self.config
        models = list(config["model_sets"][index])
        serve_config = dict(config.get("serve", {}))
        serve_config["models"] = models
        self.catalog = {model["name"]: model for model in config.get("catalog", [])}
        if self.catalog:
            self.admin_key = config.get("admin_key") or os.urandom(16).hex()
            roots = sorted({str(Path(model["folder"]).resolve().parent) for model in self.catalog.values()})
            serve_config["admin"] = {"key": self.admin_key, "model_roots": roots}
        state_dir = config.get("state_dir")
        self.state_dir = Path(state_dir) if state_dir else None
        workdir = (self.state_dir or Path(tempfile.mkdtemp(prefix="stagehand-ray-"))) / self.tag
        self.loop = asyncio.get_running_loop()
        process = ServeProcess(config["binary"], serve_config, workdir, log=config.get("log", "warn"))
        process.spawn()  # on the replica's own loop thread (see spawn)
        await asyncio.to_thread(process.wait_listening, float(config.get("start_timeout_s", 600)))
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        self.process, self.model_set = process, index
        self.static = {model["name"] for model in models}
        # A multiplexer of its own for this model set: what it registers with Ray's
        # router replaces what the last one registered.
        async def load(model_id: str) -> ServedHere:
            # A plain function: the multiplexer keeps its cache on the function.
            return await self._load_model(model_id)

        self.get_model = serve.multiplexed(
            max_num_models_per_replica=int(config.get("max_models_per_replica", 16))
        )(load)
        self._write_state({"rank": rank, "model_set": index, "addr": process.addr,
                           "pid": process.pid, "models": sorted(self.static)})
        # Register every served model with Ray's multiplexer, resident ones last.
        residency = await self.residency()
        ordered = sorted(residency["models"], key=lambda m: STATES_LAST_RESIDENT.get(m["state"], 0))
        for model in ordered:
            await self.get_model(model["id"])
        logger.info("stagehand serve at %s holds %s", process.addr, sorted(self.static))

    async def _stop(self, report_name: str) -> None:
        """Drains the process (SIGTERM) and writes its report as `report_name`."""
        process, self.process = self.process, None
        self.static = set()
        if process is None:
            return
        drain_s = float(self.config.get("serve", {}).get("limits", {}).get("drain_seconds", 30))
        report = await asyncio.to_thread(process.stop, drain_s + 15)
        if self.state_dir is not None:
            (self.state_dir / report_name).write_text(json.dumps(report.to_json()))
        logger.info("stagehand serve stopped: %s", report.to_json())

    def _write_state(self, state: dict) -> None:
        if self.state_dir is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / f"replica-{self.tag}.json").write_text(json.dumps(state))

    async def _load_model(self, model_id: str) -> ServedHere:
        """What the multiplexer calls for a model it does not have yet."""
        if model_id in self.static:
            return ServedHere(self, model_id, on_demand=False)
        if model_id not in self.catalog or self.process is None:
            raise ModelNotHere(model_id)
        async with self.session.post(
            f"{self.process.url}/admin/models",
            json=self.catalog[model_id],
            headers={"authorization": f"Bearer {self.admin_key}"},
        ) as reply:
            if reply.status not in (201, 409):
                raise ModelNotHere(f"{model_id}: loading it answered {reply.status}: {await reply.text()}")
        return ServedHere(self, model_id, on_demand=True)

    async def unload(self, model_id: str) -> None:
        process = self.process
        if self.session is None or process is None or not process.alive():
            return
        async with self.session.delete(
            f"{process.url}/admin/models/{model_id}",
            headers={"authorization": f"Bearer {self.admin_key}"},
        ) as reply:
            await reply.read()

    async def _here(self) -> bool:
        """Whether the request's model is served here now (loading it from the
        catalog); false while the process starts or switches model sets."""
        model_id = serve.get_multiplexed_model_id()
        if self.get_model is None or self.process is None:
            return False
        try:
            await self.get_model(model_id)
        except ModelNotHere:
            return False
        return model_id in self.static or model_id in self.catalog

    async def forward(self, path: str, body: bytes, headers: dict) -> tuple[int, dict, bytes]:
        """One request to the process: its status, passed headers and body."""
        process = self.process
        if not await self._here() or process is not self.process:
            return 404, {NOT_HERE: "1", "content-type": "application/json"}, b"{}"
        try:
            async with self.session.post(f"{process.url}{path}", data=body, headers=headers) as reply:
                content = await reply.read()
                return reply.status, passed(reply.headers), content
        except aiohttp.ClientError as error:
            # The process refused the connection or died before the whole answer.
            return not_taken(error)

    async def stream(self, path: str, body: bytes, headers: dict) -> AsyncIterator[Any]:
        """A streamed request: first `(status, headers)`, then the body's chunks as
        the process writes them (server-sent events pass through unchanged)."""
        process = self.process
        if not await self._here() or process is not self.process:
            yield 404, {NOT_HERE: "1", "content-type": "application/json"}
            return
        try:
            reply = await self.session.post(f"{process.url}{path}", data=body, headers=headers)
        except aiohttp.ClientError as error:
            status, head, content = not_taken(error)
            yield status, head
            yield content
            return
        async with reply:
            yield reply.status, passed(reply.headers)
            async for chunk in reply.content.iter_any():
                yield chunk

    async def residency(self) -> dict:
        async with self.session.get(f"{self.process.url}/residency") as reply:
            return await reply.json()

    async def check_health(self) -> None:
        """Raising makes Ray replace this replica: the process exited, or /ready is
        not 200."""
        process = self.process
        if process is None:
            return  # starting, or switching model sets
        if not process.alive():
            raise ServeFailed(f"stagehand serve exited:\n{process.stderr_tail()}")
        try:
            async with self.session.get(f"{process.url}/ready") as reply:
                if reply.status != 200:
                    raise ServeFailed(f"/ready answered {reply.status}")
        except aiohttp.ClientError as error:
            raise ServeFailed(f"/ready did not answer: {error}") from error

    async def __del__(self) -> None:
        """Ray's graceful shutdown: the process drains (SIGTERM) and reports."""
        await self._stop(f"drain-{self.tag}.json")
        if self.session is not None:
            await self.session.close()
            self.session = None


def passed(headers) -> dict:
    return {name: headers[name] for name in PASSED_HEADERS if name in headers}


def not_taken(error: Exception) -> tuple[int, dict, bytes]:
    body = error_body(f"the replica's stagehand serve did not take the request: {error}",
                      "service_unavailable", "unavailable")
    return 503, {NOT_TAKEN: "1", "retry-after": "1", "content-type": "application/json"}, json.dumps(body).encode()


@serve.deployment(name="OpenAIIngress", max_ongoing_requests=1024)
class OpenAIIngress:
    """The OpenAI-compatible front: routes each request by its `model` to a replica
    that holds it, passes the answer on (status, `Retry-After`, SSE chunks)."""

    def __init__(self, replicas: DeploymentHandle, models: list[str], retry_seconds: float = 30.0) -> None:
        self.replicas = replicas
        self.models = sorted(set(models))
        # How long a request not taken (its replica's process gone, or the model not
        # there) is asked again: long enough for Ray to replace a replica.
        self.retry_seconds = retry_seconds
        self.stats = {"requests": 0, "first_attempt_here": 0, "asked_again": 0, "unavailable": 0}

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "GET" and path == "/health":
            return JSONResponse({"status": "ok"})
        if request.method == "GET" and path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "stagehand"} for m in self.models]
            return JSONResponse({"object": "list", "data": data})
        if request.method == "GET" and path == "/ingress/stats":
            return JSONResponse(self.stats)
        if request.method != "POST" or path not in MODEL_PATHS:
            return JSONResponse(error_body(f"no route {request.method} {path}", "invalid_request_error",
                                           "not_found"), status_code=404)
        body = await request.body()
        try:
            parsed = json.loads(body)
            model = parsed["model"]
            streamed = bool(parsed.get("stream"))
            if not isinstance(model, str):
                raise TypeError("model is not a string")
        except (ValueError, KeyError, TypeError) as error:
            return JSONResponse(error_body(f"the body is not a valid request: {error}",
                                           "invalid_request_error", param="model"), status_code=400)
        base = model.split(":", 1)[0]  # MODEL:ADAPTER is served where MODEL is
        if base not in self.models:
            return JSONResponse(error_body(f"the model `{model}` does not exist; served: {', '.join(self.models)}",
                                           "invalid_request_error", "model_not_found", "model"), status_code=404)
        headers = {name: request.headers[name] for name in ("authorization", "content-type")
                   if name in request.headers}
        self.stats["requests"] += 1
        handle = self.replicas.options(multiplexed_model_id=base)
        if streamed:
            return await self._stream(handle, path, body, headers)
        return await self._forward(handle, path, body, headers)

    def _again(self, attempt: int, reason: str) -> float:
        if attempt == 0 and reason == "not_here":
            self.stats["asked_again"] += 1
        return min(0.05 * (attempt + 1), 0.5)

    def _attempts(self):
        """0, 1, 2, ... while the retry time lasts."""
        deadline = time.monotonic() + self.retry_seconds
        attempt = 0
        while attempt == 0 or time.monotonic() < deadline:
            yield attempt
            attempt += 1

    async def _forward(self, handle, path: str, body: bytes, headers: dict) -> Response:
        for attempt in self._attempts():
            try:
                status, head, content = await handle.forward.remote(path, body, headers)
            except RayActorError:
                # The replica died before answering: the request had not been taken
                # by a live process (or was lost with it); ask again, Ray routes to
                # a live replica.
                await asyncio.sleep(self._again(attempt, "died"))
                continue
            if NOT_HERE in head or NOT_TAKEN in head:
                await asyncio.sleep(self._again(attempt, "not_here" if NOT_HERE in head else "not_taken"))
                continue
            if attempt == 0:
                self.stats["first_attempt_here"] += 1
            return Response(content, status_code=status, headers=head)
        self.stats["unavailable"] += 1
        return unavailable("no replica holding the model answered; try again")

    async def _stream(self, handle, path: str, body: bytes, headers: dict) -> Response:
        streaming = handle.options(stream=True)
        for attempt in self._attempts():
            chunks = streaming.stream.remote(path, body, headers)
            try:
                status, head = await chunks.__anext__()
            except (RayActorError, StopAsyncIteration):
                await asyncio.sleep(self._again(attempt, "died"))
                continue
            if NOT_HERE in head or NOT_TAKEN in head:
                chunks.cancel()
                await asyncio.sleep(self._again(attempt, "not_here" if NOT_HERE in head else "not_taken"))
                continue
            if attempt == 0:
                self.stats["first_attempt_here"] += 1
            return StreamingResponse(_rest(chunks), status_code=status, headers=head)
        self.stats["unavailable"] += 1
        return unavailable("no replica holding the model answered; try again")


async def _rest(chunks) -> AsyncIterator[bytes]:
    """The stream's body; a replica that dies mid-stream ends it (the client sees
    no `data: [DONE]`)."""
    try:
        async for chunk in chunks:
            yield chunk
    except RayActorError as error:
        logger.warning("a stream ended early: its replica died: %s", error)


def load_config(path: str) -> dict:
    """The deployment config: YAML (or JSON), relative folders resolved against it."""
    import yaml  # Ray depends on PyYAML

    source = Path(path)
    config = yaml.safe_load(source.read_text())
    base = source.resolve().parent

    def resolve(value: str) -> str:
        return str((base / value).resolve()) if not os.path.isabs(value) else value

    config["binary"] = resolve(config["binary"])
    for model in itertools.chain(*config["model_sets"], config.get("catalog", [])):
        model["folder"] = resolve(model["folder"])
    if config.get("serve", {}).get("settings"):
        config["serve"]["settings"] = resolve(config["serve"]["settings"])
    if config.get("state_dir"):
        config["state_dir"] = resolve(config["state_dir"])
    return config


def build_app(args: dict):
    """`serve run stagehand_ray.app:build_app config=FILE` (or `import_path` in a
    Serve config file): the replicas and the ingress from FILE."""
    config = args["config"] if isinstance(args.get("config"), dict) else load_config(args["config"])
    drain_s = float(config.get("serve", {}).get("limits", {}).get("drain_seconds", 30))
    options: dict = {
        "ray_actor_options": {
            "num_gpus": float(config.get("gpus_per_replica", 1)),
            "num_cpus": float(config.get("cpus_per_replica", 1)),
        },
        "user_config": config,
        # Ray waits this long for the replica's requests, then calls __del__ (the
        # process's own drain: drain_seconds and the release of both budgets).
        "graceful_shutdown_timeout_s": drain_s + 30,
        "max_ongoing_requests": int(config.get("max_ongoing_requests", 64)),
    }
    if "autoscaling" in config:
        options["autoscaling_config"] = config["autoscaling"]
    else:
        options["num_replicas"] = int(config.get("num_replicas", len(config["model_sets"])))
    replicas = StagehandReplica.options(**options).bind()
    names = [model["name"] for model in itertools.chain(*config["model_sets"], config.get("catalog", []))]
    # The ingress holds each request (a stream to its end) as long as the replicas do.
    ingress = OpenAIIngress.options(graceful_shutdown_timeout_s=drain_s + 30)
    return ingress.bind(replicas, names, float(config.get("retry_seconds", 30)))
