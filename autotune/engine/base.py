"""The engine interface: something that starts an OpenAI-compatible server from a command line.

The tuner never imports vLLM (DESIGN.md, principle 1): an engine is a process it launches and speaks
to over HTTP. `vllm` runs a real vLLM; `sim` runs the labelled simulator the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence


@dataclass
class StartupInfo:
    """What the server said about itself while starting (parsed from its log)."""

    startup_seconds: float
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    init_engine_seconds: float | None = None
    model_memory_gib: float | None = None
    graph_capture_seconds: float | None = None
    engine_version: str | None = None
    simulated: bool = False
    phases: dict[str, float] | None = None   # seconds per startup phase (engine/phases.py)


class EngineFailure(Exception):
    """The server could not start or died; `cause` is one of autotune.causes."""

    def __init__(self, cause: str, detail: str, log_tail: str = "", exit_code: int | None = None):
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail
        self.log_tail = log_tail
        self.exit_code = exit_code


@dataclass
class LaunchRequest:
    """Everything one launch needs. `flags` are the candidate's rendered CLI flags (fixed flags first)."""

    model: str
    flags: Sequence[str]
    port: int
    log_path: Path
    gpus: Sequence[int] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 600.0
    cores: Sequence[int] = ()          # CPU cores the server is pinned to (its lease's); () = unpinned


class Server(ABC):
    """A started server process (its own process group)."""

    pid: int
    url: str           # base URL, e.g. http://127.0.0.1:8123
    log_path: Path

    @abstractmethod
    def wait_ready(self) -> StartupInfo:
        """Block until /health is 200. Raises EngineFailure at once on early exit, or on timeout."""

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def failure(self) -> EngineFailure | None:
        """If the process has died (e.g. under load), the classified cause; else None."""

    @abstractmethod
    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the group, SIGKILL after grace; returns when the group is gone. Idempotent."""

    def log_tail(self, lines: int = 40) -> str:
        from autotune.engine.process import read_log

        return "\n".join(read_log(self.log_path).splitlines()[-lines:])


class Engine(ABC):
    """Starts servers. One instance per study (it caches `--help` and the version)."""

    name: str

    @abstractmethod
    def launch(self, request: LaunchRequest) -> Server: ...

    @abstractmethod
    def unknown_flags(self, flags: Sequence[str]) -> list[str]:
        """Flags (as `--name`) that the engine's own `--help` does not list; cached per command."""

    @abstractmethod
    def version(self) -> str | None: ...

    def release_wait(self, port: int, gpus: Sequence[int], timeout_s: float = 60.0) -> None:
        """Wait until the port is free (and, on GPUs, the memory released) before the next launch."""
