"""The `vllm` engine: a real vLLM server started from a command line and spoken to over HTTP.

The command is whatever starts vLLM on this host (`vllm serve`, `python -m
vllm.entrypoints.openai.api_server`, `docker run ... image`); the tuner never imports vLLM. Placeholders
`{model}`, `{port}` and `{gpus}` in the command's items are filled per launch, so a container command
can map its port and devices; when `{model}`/`{port}` are absent, `--model M` / `--host 127.0.0.1 --port P`
are appended instead. The candidate's flags always come last.

    >>> engine = VLLMEngine([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])  # doctest: +SKIP
    >>> server = engine.launch(LaunchRequest(model="models/demo", flags=["--enforce-eager"],
    ...                                      port=find_free_port(), log_path=Path("trial-0.log")))
    >>> info = server.wait_ready(); server.stop()
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx
import psutil

from autotune import causes
from autotune.engine.base import Engine, EngineFailure, LaunchRequest, Server, StartupInfo
from autotune.engine.logparse import classify_failure, parse_startup
from autotune.engine.phases import startup_phases
from autotune.engine.process import (ProcessRecord, find_free_port, owner_alive_here, process_create_time,
                                     read_log, spawn, stop_group, wait_port_free)
from autotune.errors import UserError

_OPTION = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_.-]*")
_VERSION = re.compile(r"\b(\d+\.\d+\.\d+[\w.+-]*)")
_POLL_S = 0.25          # how often the process is polled while waiting for readiness
_HEALTH_TIMEOUT_S = 2.0
_HELP_TIMEOUT_S = 300.0
_GPU_RELEASE_SLACK = 512 * 1024**2  # bytes above the launch baseline that count as "released"
_SOCKET_PATH_MAX = 107              # sun_path's bytes less its terminating NUL (Linux)
_SOCKET_NAME = 37                   # "/" and the UUID vLLM names each IPC socket with
_RPC_PREFIX = "autotune-rpc-"       # + owner PID, its start time (1/100 s) and mkdtemp's letters


def _log_since(path: Path, offset: int) -> str:
    return read_log(path, offset)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


class VLLMServer(Server):
    """One vLLM process group. pid, pgid and create_time identify it for kill_leftovers."""

    def __init__(self, popen: subprocess.Popen[bytes], argv: list[str], request: LaunchRequest,
                 log_offset: int, started: float, rpc_dir: Path | None = None):
        self.popen = popen
        self.rpc_dir = rpc_dir     # its engine's IPC sockets (VLLM_RPC_BASE_PATH), removed when it stops
        self.argv = argv
        self.pid = popen.pid
        self.pgid = os.getpgid(popen.pid) if popen.poll() is None else popen.pid
        try:
            self.create_time = psutil.Process(popen.pid).create_time()
        except psutil.Error:  # already gone: the classification will say why
            self.create_time = 0.0
        self.port = request.port
        self.url = f"http://127.0.0.1:{request.port}"
        self.log_path = request.log_path
        self.startup_timeout_s = request.startup_timeout_s
        self.ready = False
        self.startup: StartupInfo | None = None
        self._log_offset = log_offset
        self._started = started
        self._stopped = False
        self._failure: EngineFailure | None = None

    @property
    def record(self) -> ProcessRecord:
        return ProcessRecord(self.pid, self.pgid, self.create_time)

    def log_text(self) -> str:
        """What this server wrote (the log file may hold earlier launches: it is opened for append)."""
        return _log_since(self.log_path, self._log_offset)

    def _dead(self, exit_code: int | None) -> EngineFailure:
        # The leader died; EngineCore/workers may linger holding memory. Reap the whole group first.
        stop_group(self.pid, self.pgid, grace_s=5.0, popen=self.popen)
        _remove(self.rpc_dir)
        text = self.log_text()
        cause, detail = classify_failure(text, exit_code)
        return EngineFailure(cause, detail, log_tail=_tail(text), exit_code=exit_code)

    def wait_ready(self) -> StartupInfo:
        deadline = self._started + self.startup_timeout_s
        with httpx.Client(timeout=_HEALTH_TIMEOUT_S, trust_env=False) as client:
            while True:
                code = self.popen.poll()
                if code is not None:
                    self._failure = self._dead(code)
                    self._stopped = True
                    raise self._failure
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline:
                    self.stop(grace_s=5.0)
                    text = self.log_text()
                    raise EngineFailure(causes.STARTUP_TIMEOUT,
                                        f"not ready within {self.startup_timeout_s:g} s (no /health 200)",
                                        log_tail=_tail(text), exit_code=self.popen.returncode)
                time.sleep(_POLL_S)
        self.ready = True
        text = self.log_text()
        found = parse_startup(text)
        seconds = round(time.monotonic() - self._started, 3)
        self.startup = StartupInfo(startup_seconds=seconds, **found, phases=startup_phases(text, seconds))
        return self.startup

    def alive(self) -> bool:
        return self.popen.poll() is None

    def failure(self) -> EngineFailure | None:
        if self._failure is not None:
            return self._failure
        code = self.popen.poll()
        if code is None or self._stopped:
            return None  # running, or stopped by us: not a failure
        self._failure = self._dead(code)
        self._stopped = True
        return self._failure

    def stop(self, grace_s: float = 15.0) -> None:
        if self._stopped:
            return
        stop_group(self.pid, self.pgid, grace_s=grace_s, popen=self.popen)
        _remove(self.rpc_dir)
        self._stopped = True


class VLLMEngine(Engine):
    """Starts vLLM servers from `command`; caches `--help` and `--version` on disk per command."""

    name = "vllm"

    def __init__(self, command: Sequence[str], cache_dir: Path | None = None):
        if not command:
            raise UserError("engine command is empty")
        self.command = [str(part) for part in command]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "autotune" / "help"
        self._key = hashlib.sha256(json.dumps(self.command).encode()).hexdigest()[:16]
        self._options: set[str] | None = None
        self._version: str | None = None
        self._launch_logs: list[tuple[Path, int]] = []  # newest last; banners carry the version
        self._gpu_baseline: dict[int, int] = {}

    # -- launching -------------------------------------------------------------------------------------

    def argv(self, model: str, port: int, gpus: Sequence[int] = (), flags: Sequence[str] = ()) -> list[str]:
        """The exact command line of one launch (also what an export would print)."""
        gpu_list = ",".join(str(g) for g in gpus)
        joined = "\0".join(self.command)
        argv = [part.replace("{model}", model).replace("{port}", str(port)).replace("{gpus}", gpu_list)
                for part in self.command]
        if "{model}" not in joined:
            argv += ["--model", model]
        if "{port}" not in joined:
            argv += ["--host", "127.0.0.1", "--port", str(port)]
        return argv + [str(flag) for flag in flags]

    def launch(self, request: LaunchRequest) -> VLLMServer:
        argv = self.argv(request.model, request.port, request.gpus, request.flags)
        env = {**os.environ, **request.env, "VLLM_SERVER_DEV_MODE": "1"}
        if request.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in request.gpus)
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # so indices mean what NVML means
            # per GPU, so that concurrent launches on disjoint GPUs keep each other's baselines
            self._gpu_baseline = {**self._gpu_baseline, **(_gpu_used_bytes(request.gpus) or {})}
        # vLLM puts its processes' ZMQ sockets in /tmp and leaves them there when it is stopped by a
        # signal: thousands of files after a night of trials. Each server gets a folder of its own that
        # its stop removes (unless the user points vLLM somewhere, or the folder's path would leave no
        # room for a socket's name: a Unix socket's path holds at most 107 bytes).
        rpc_dir = None
        if "VLLM_RPC_BASE_PATH" not in env:
            rpc_dir = _ipc_folder()
            if len(str(rpc_dir)) + _SOCKET_NAME <= _SOCKET_PATH_MAX:
                env["VLLM_RPC_BASE_PATH"] = str(rpc_dir)
            else:
                _remove(rpc_dir)
                rpc_dir = None
        offset = request.log_path.stat().st_size if request.log_path.exists() else 0
        started = time.monotonic()
        try:
            popen = spawn(argv, request.log_path, env=env, cores=request.cores)
        except (FileNotFoundError, PermissionError) as exc:
            _remove(rpc_dir)
            raise UserError(f"engine command not found: {argv[0]} ({exc.strerror})") from None
        self._launch_logs = [*self._launch_logs[-7:], (request.log_path, offset)]
        return VLLMServer(popen, argv, request, offset, started, rpc_dir)

    def release_wait(self, port: int, gpus: Sequence[int], timeout_s: float = 60.0) -> None:
        """Port free, and on GPUs the memory back near its launch baseline, or timeout_s spent.

        A new launch that measures free memory while the last one's CUDA context is still being torn
        down would see a false startup_oom; this wait is what keeps trials independent.
        """
        deadline = time.monotonic() + timeout_s
        wait_port_free(port, timeout_s)
        if not gpus or not self._gpu_baseline:
            return
        while time.monotonic() < deadline:
            used = _gpu_used_bytes(gpus)
            if used is None or all(used.get(g, 0) <= self._gpu_baseline.get(g, 0) + _GPU_RELEASE_SLACK for g in gpus):
                return
            time.sleep(0.5)

    # -- knowing the engine ----------------------------------------------------------------------------

    def _probe_argv(self, extra: str) -> list[str]:
        # Placeholders must be filled for the command to run at all (a container needs a port map).
        parts = [p.replace("{model}", "model").replace("{port}", str(find_free_port())).replace("{gpus}", "0")
                 for p in self.command]
        return parts + [extra]

    def _run(self, extra: str) -> tuple[int, str]:
        argv = self._probe_argv(extra)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=_HELP_TIMEOUT_S,
                                  start_new_session=True)
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            raise UserError(f"engine command not found: {self.command[0]} ({exc.strerror})") from None
        except subprocess.TimeoutExpired:
            return 124, ""
        return done.returncode, done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")

    def _cached(self, suffix: str) -> Path:
        return self.cache_dir / f"{self._key}{suffix}"

    def known_options(self) -> set[str]:
        """Every `--long-option` the engine's help lists (incl. `--no-x`), from disk after the first run."""
        if self._options is not None:
            return self._options
        path = self._cached(".txt")
        if path.is_file():
            text = path.read_text()
        else:
            code, text = self._run("--help=all")
            if code != 0 or len(_OPTION.findall(text)) < 10:
                code, text = self._run("--help")
            if code != 0 or len(_OPTION.findall(text)) < 10:
                first = next((ln for ln in text.splitlines() if "rror" in ln), text.strip()[-200:])
                raise UserError(f"engine command failed to print its help: {' '.join(self.command)}: {first.strip()}")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
        self._options = {opt.rstrip(".").replace("_", "-") for opt in _OPTION.findall(text)}
        return self._options

    def unknown_flags(self, flags: Sequence[str]) -> list[str]:
        known = self.known_options()
        unknown: list[str] = []
        for flag in flags:
            flag = str(flag)
            if not flag.startswith("--") or flag == "--":
                continue
            name = flag.split("=", 1)[0].replace("_", "-")
            base = name.split(".", 1)[0]  # vLLM accepts --compilation-config.mode style sub-keys
            if name not in known and base not in known and name not in unknown:
                unknown.append(name)
        return unknown

    def version(self) -> str | None:
        """From `--version` (cached on disk), else from the banner of the latest launch log that has one."""
        if self._version is not None:
            return self._version
        path = self._cached(".version")
        if not path.is_file():  # run once per command; "" records that it has no --version
            code, text = self._run("--version")
            lines = [ln for ln in text.splitlines() if ln.strip() and "warn" not in ln.lower()]
            match = _VERSION.fullmatch(lines[-1].strip().lstrip("v")) if code == 0 and lines else None
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text((match.group(1) if match else "") + "\n")
        self._version = path.read_text().strip() or None
        for log_path, offset in reversed(self._launch_logs if self._version is None else []):
            # A launch that failed in argparse prints no banner; an earlier one may have.
            self._version = parse_startup(_log_since(log_path, offset)).get("engine_version")
            if self._version:
                break
        return self._version


def _ipc_folder() -> Path:
    """A new folder for one server's IPC sockets, named for this process (PID and start time). The
    folders of autotune processes that are gone are removed first: a process killed with SIGKILL could not
    remove its servers' (they die with it, by their parent-death signal, and leave their sockets)."""
    for old in Path(tempfile.gettempdir()).glob(_RPC_PREFIX + "*"):
        owner = re.fullmatch(re.escape(_RPC_PREFIX) + r"(\d+)-(\d+)-\w+", old.name)
        if owner is not None and not owner_alive_here(int(owner[1]), int(owner[2]) / 100):
            _remove(old)
    started = round(process_create_time() * 100)
    return Path(tempfile.mkdtemp(prefix=f"{_RPC_PREFIX}{os.getpid()}-{started}-"))


def _remove(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _gpu_used_bytes(gpus: Sequence[int]) -> dict[int, int] | None:
    """Used memory per GPU index via NVML; None when NVML is unavailable (CPU hosts)."""
    try:
        import pynvml  # noqa: PLC0415 - optional, and slow to import

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library: simply no GPU accounting
        return None
    try:
        return {g: int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(g)).used) for g in gpus}
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
