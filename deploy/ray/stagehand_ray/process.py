"""One `stagehand serve` process, supervised: started with its config on a free
loopback port, forwarded to over HTTP, probed (`/ready`, `/residency`), and stopped
by SIGTERM — which drains it — with its final report read back (every model's
budgets, which must be 0).

Plain Python with no Ray in it, so it is tested and reused on its own; the Ray
replica (`app.py`) is a thin shell around it."""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from . import toml

LISTENING = "stagehand serve: listening on http://"
STOPPED = re.compile(
    r"^stagehand serve: (?P<model>\S+) stopped; vram (?P<vram>.+) and pinned (?P<pinned>.+) still held$"
)
# The last lines of stderr kept for an error message.
STDERR_LINES = 200


class ServeFailed(RuntimeError):
    """The process did not start, or stopped, with what it wrote to stderr."""


@dataclass
class DrainReport:
    """How a stopped process ended: its exit code and what each model still held."""

    exit_code: Optional[int]
    models: dict = field(default_factory=dict)
    killed: bool = False

    @property
    def budgets_zero(self) -> bool:
        """Every model gave both budgets back (and there was at least one)."""
        return bool(self.models) and all(
            held["vram"] == "0 B" and held["pinned"] == "0 B" for held in self.models.values()
        )

    def to_json(self) -> dict:
        return {
            "exit_code": self.exit_code,
            "models": self.models,
            "killed": self.killed,
            "budgets_zero": self.budgets_zero,
        }


def _with_parent_death_signal(command: list[str]) -> list[str]:
    """`command` under util-linux's `setpriv --pdeathsig TERM` where it exists: the
    process gets SIGTERM (a drain) if its supervisor dies, so a replica killed
    outright leaves no orphan holding a GPU. Not a `preexec_fn`: Python code between
    fork and exec in a process with Ray's gRPC threads can crash the child before it
    runs (seen: SIGABRT/SIGALRM in the forked child)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return command  # without it, the supervisor's __del__ still stops the process
    return [setpriv, "--pdeathsig", "TERM", "--", *command]


class ServeProcess:
    """`stagehand serve --config CONFIG` on 127.0.0.1 (a free port)."""

    def __init__(
        self,
        binary: str,
        config: Mapping[str, Any],
        workdir: Path,
        log: str = "warn",
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.binary = binary
        self.config = dict(config)
        self.workdir = Path(workdir)
        self.log = log
        self.env = dict(os.environ if env is None else env)
        self.addr: Optional[str] = None
        self._child: Optional[subprocess.Popen] = None
        self._stdout: list[str] = []
        self._stderr: collections.deque = collections.deque(maxlen=STDERR_LINES)
        self._readers: list[threading.Thread] = []
        self.report: Optional[DrainReport] = None

    @property
    def pid(self) -> Optional[int]:
        return self._child.pid if self._child else None

    @property
    def url(self) -> str:
        if self.addr is None:
            raise ServeFailed("stagehand serve is not running")
        return f"http://{self.addr}"

    def alive(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr)

    def start(self, timeout_s: float = 600.0) -> str:
        """Writes the config, starts the process and waits for its address (every
        model loaded). A failure names the exit code and stderr's last lines."""
        self.spawn()
        return self.wait_listening(timeout_s)

    def spawn(self) -> None:
        """Writes the config and starts the process. Call it on a thread that lives as
        long as the supervisor: the child's parent-death signal follows the thread
        that spawned it, not the process."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = dict(self.config)
        config["bind"] = "127.0.0.1:0"
        path = self.workdir / "serve.toml"
        path.write_text(toml.dumps(config))
        command = [self.binary, "serve", "--config", str(path), "--log", self.log]
        self._child = subprocess.Popen(
            _with_parent_death_signal(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )

    def wait_listening(self, timeout_s: float) -> str:
        """Waits for the line that gives the address (printed once every model is
        loaded); may run on any thread."""
        if self._child is None:
            raise ServeFailed("stagehand serve was not started")
        first: list[str] = []
        reader = threading.Thread(
            target=lambda: first.append(self._child.stdout.readline()), daemon=True
        )
        reader.start()
        self._follow(self._child.stderr, self._stderr)
        reader.join(timeout_s)
        line = first[0].strip() if first else ""
        if not line.startswith(LISTENING):
            self.kill()
            raise ServeFailed(
                f"stagehand serve did not start (exit {self._child.returncode}): "
                f"{line or 'no output'}\n{self.stderr_tail()}"
            )
        self.addr = line[len(LISTENING):]
        self._follow(self._child.stdout, self._stdout)
        return self.addr

    def _follow(self, stream, into) -> None:
        def read() -> None:
            for line in stream:
                into.append(line.rstrip("\n"))

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        self._readers.append(thread)

    def stop(self, timeout_s: float) -> DrainReport:
        """SIGTERM (serve drains: 503 for new requests, in-flight ones get
        drain_seconds, then both budgets are released), wait up to `timeout_s`, then
        SIGKILL. Returns what each model still held as serve printed it."""
        if self.report is not None:
            return self.report
        if self._child is None:
            self.report = DrainReport(exit_code=None)
            return self.report
        killed = False
        if self._child.poll() is None:
            self._child.send_signal(signal.SIGTERM)
            try:
                self._child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
                killed = True
        for reader in self._readers:
            reader.join(5)
        models = {}
        for line in self._stdout:
            match = STOPPED.match(line)
            if match:
                models[match["model"]] = {"vram": match["vram"], "pinned": match["pinned"]}
        self.report = DrainReport(exit_code=self._child.returncode, models=models, killed=killed)
        return self.report

    def kill(self) -> None:
        """SIGKILL, no drain: only for a process that failed to start."""
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
            self._child.wait()
