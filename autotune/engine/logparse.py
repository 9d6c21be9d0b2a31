"""Read a vLLM server log: what it said about itself at startup, and why it died.

vLLM's wording moves between releases (0.24 on GPUs, 0.32 on the CPU build use different module
names, "GPU"/"CPU" prefixes, thousands separators), so every pattern here matches the stable core of
the message and tolerates the rest. The failure patterns are ordered from most to least specific:
a log usually holds several error lines (the root cause in EngineCore, then the API server's
"Engine core initialization failed"), and the root cause must win.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autotune import causes

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

_STARTUP_PATTERNS: dict[str, re.Pattern[str]] = {
    "kv_cache_tokens": re.compile(r"(?:GPU|CPU|XPU|TPU)?\s*KV cache size:\s*" + _NUM + r"\s*tokens", re.I),
    "max_concurrency": re.compile(r"Maximum concurrency for\s*[0-9,]+\s*tokens per request:\s*" + _NUM + r"\s*x", re.I),
    "init_engine_seconds": re.compile(r"init engine \([^)]*\) took\s*" + _NUM + r"\s*s", re.I),
    "model_memory_gib": re.compile(r"Model loading took\s*" + _NUM + r"\s*GiB", re.I),
    "graph_capture_seconds": re.compile(r"Graph capturing finished in\s*" + _NUM + r"\s*sec", re.I),
}
_VERSION_PATTERNS = (
    re.compile(r"\bversion\s+v?([0-9]+\.[0-9]+\.[0-9]+[\w.+-]*)"),          # banner, 0.2x+
    re.compile(r"Initializing a V1 LLM engine \(v([0-9]+\.[0-9]+\.[0-9]+[\w.+-]*)\)"),
    re.compile(r"vLLM API server version\s+v?([0-9]+\.[0-9]+\.[0-9]+[\w.+-]*)"),  # older releases
)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_startup(text: str) -> dict[str, Any]:
    """Figures vLLM prints while starting; keys of StartupInfo, absent when the log lacks them.

    The first occurrence wins: later lines (a second engine under data parallelism) repeat them.
    """
    found: dict[str, Any] = {}
    for key, pattern in _STARTUP_PATTERNS.items():
        match = pattern.search(text)
        if match:
            value = _number(match.group(1))
            found[key] = int(value) if key == "kv_cache_tokens" else value
    for pattern in _VERSION_PATTERNS:
        match = pattern.search(text)
        if match:
            found["engine_version"] = match.group(1)
            break
    return found


def logged_kv_tokens(path: Path) -> int | None:
    """The KV-cache size in tokens that a server's log states (its first engine's), or None where the log
    cannot be read or has not said it. The capacity search bounds its steps by it (bench/step_bounds.py)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    value = parse_startup(text).get("kv_cache_tokens")
    return int(value) if value else None


# (cause, pattern). The detail quotes the matched line, so the pattern only has to find it.
_FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # argparse: "prog: error: unrecognized arguments: ...", "prog: error: argument --x: invalid ..."
    (causes.BAD_FLAG, re.compile(r"(?:^|\s)\S+: error: (?:unrecognized arguments|argument |the following arguments).*", re.M)),
    # Every flag parsed, but vLLM's config checks rejected the combination (bad_config, not a crash):
    # pydantic validation of a *Config (max-model-len above the model's, batched tokens below max seqs
    # or below max-model-len with chunked prefill off, ...), as 0.2x+ prints it ...
    (causes.BAD_CONFIG, re.compile(r"\d+ validation errors? for \w*Config.*\n(?:.*\n)?.*", re.I)),
    # ... and the same checks as plain ValueErrors (releases before the pydantic configs).
    (causes.BAD_CONFIG, re.compile(r"ValueError: (?:max_num_batched_tokens|max_model_len|max_num_seqs|"
                                   r"User-specified max_model_len)\b.*(?:smaller than|greater than|must be).*")),
    # a VLM whose largest image does not fit the step's token budget with chunked MM input off
    (causes.BAD_CONFIG, re.compile(r"ValueError: Chunked MM input disabled but max_tokens_per_mm_item.*")),
    (causes.STARTUP_OOM, re.compile(r"Free memory on device.*less than desired GPU memory utilization.*", re.I)),
    (causes.STARTUP_OOM, re.compile(r"Available memory on node.*less than desired CPU memory utilization.*", re.I)),
    # the CPU build 0.32's check at KV allocation: a negative request is a fraction that leaves the KV
    # cache nothing beside the weights (too small); a positive one the node could not give (too large)
    (causes.KV_TOO_SMALL, re.compile(r"Available memory on node.*less than requested memory for kv \(-.*", re.I)),
    (causes.STARTUP_OOM, re.compile(r"Available memory on node.*less than requested memory for kv.*", re.I)),
    (causes.KV_TOO_SMALL, re.compile(r"To serve at least one request with the model\S* max seq len.*", re.I)),
    (causes.KV_TOO_SMALL, re.compile(r"No available memory for the cache blocks.*", re.I)),
    (causes.KV_TOO_SMALL, re.compile(r"insufficient KV cache memory.*|KV cache is needed, which is larger than.*", re.I)),
)
# A ValueError/TypeError raised while vLLM builds its config from the flags (before any engine process):
# the traceback passes through create_engine_config. Checked after the specific memory causes.
_CONFIG_FRAME = re.compile(r"in create_engine_config\b")
_CONFIG_ERROR = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?((?:ValueError|TypeError|NotImplementedError): .*)$", re.M)
_OOM = re.compile(r"(?:CUDA|HIP|XPU)? ?out of memory.*|OutOfMemoryError.*|Cannot allocate memory.*", re.I)
_READY = re.compile(r"Application startup complete|Starting vLLM (?:API )?server on", re.I)
# A line that names the error when nothing more specific matched.
_GENERIC = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s*)?(?:ERROR [^\]]*\]\s*)?"
    r"((?:[\w.]+(?:Error|Exception)|RuntimeError|ValueError|Killed|Segmentation fault)\b.*)$",
    re.M,
)
_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*(?:(?:ERROR|WARNING|INFO) [^\]]*\]\s*)?")
_SIGNALS = {9: "SIGKILL (killed, often the kernel OOM killer)", 11: "SIGSEGV", 6: "SIGABRT", 15: "SIGTERM"}


_PORT_IN_USE = re.compile(r"Address already in use|EADDRINUSE|\[Errno 98\]", re.I)


def port_in_use(text: str) -> bool:
    """The server could not bind its port (or an internal one) because another process holds it:
    vLLM's `OSError: [Errno 98] Address already in use` from create_server_socket, or ZMQ's wording."""
    return _PORT_IN_USE.search(text) is not None


def _one_line(text: str, limit: int = 300) -> str:
    """Strip vLLM's "(Proc pid=N) LEVEL date [file]" prefixes and join continuation lines."""
    parts = [_PREFIX.sub("", line.strip()).strip() for line in text.strip().splitlines()]
    line = " | ".join(p for p in parts if p)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _exit_words(exit_code: int | None) -> str:
    if exit_code is None:
        return "no exit code"
    if exit_code < 0:
        return f"killed by {_SIGNALS.get(-exit_code, f'signal {-exit_code}')}"
    return f"exit code {exit_code}"


def classify_failure(text: str, exit_code: int | None) -> tuple[str, str]:
    """(cause, one-line detail quoting vLLM) for a server that exited or was found dead.

    Before readiness a memory error is a startup OOM; after "Application startup complete" it is a
    runtime OOM, as is a SIGKILL after readiness (the kernel's OOM killer leaves no log line).
    """
    for cause, pattern in _FAILURES:
        match = pattern.search(text)
        if match:
            return cause, _one_line(match.group(0))
    ready = _READY.search(text)
    frame = _CONFIG_FRAME.search(text)
    if frame is not None and ready is None:
        error = _CONFIG_ERROR.search(text, frame.end())
        if error:
            return causes.BAD_CONFIG, _one_line(error.group(1))
    oom = _OOM.search(text)
    if oom:
        after_ready = ready is not None and oom.start() > ready.start()
        return (causes.RUNTIME_OOM if after_ready else causes.STARTUP_OOM), _one_line(oom.group(0))
    if ready is not None and exit_code is not None and exit_code == -9:
        return causes.RUNTIME_OOM, f"{_exit_words(exit_code)} after the server was ready"
    errors = _GENERIC.findall(text)
    detail = _one_line(errors[-1]) if errors else "no error line in the log"
    # A normal shutdown prints EngineDeadError; it is never the root cause worth quoting first.
    real = [e for e in errors if "EngineDeadError" not in e and "Engine core initialization failed" not in e]
    if real:
        detail = _one_line(real[0])
    return causes.CRASH, f"{detail} ({_exit_words(exit_code)})"


# A kernel compiled (or autotuned) while the server was serving: vLLM's JIT monitor (0.24+, active once
# warm-up is done) warns "Triton kernel JIT compilation during inference: NAME. This causes a latency
# spike" (also "CuTeDSL/TileLang JIT compilation during inference: NAME"), and turns on Triton's own
# autotuning print, "Triton autotuning for function NAME,". Without `--jit-monitor-verbose` vLLM warns
# once per kernel name and worker process: a later compile of the same kernel (another shape) is silent.
_JIT_COMPILE = re.compile(r"JIT compilation during inference: ([\w.<>-]*\w)|Triton autotuning for function ([\w.]+)")


def jit_compiles(text: str) -> list[str]:
    """Names of the kernels the server compiled while serving, in the order its log names them (a name
    once per line that names it)."""
    return [m.group(1) or m.group(2) for m in _JIT_COMPILE.finditer(text)]
