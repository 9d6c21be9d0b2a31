"""Where a vLLM start spends its time, read from its log: process and imports, weights, compile,
KV-cache profiling, CUDA graphs, and the rest (warm-up, API server). On the H200 a start took 81-151 s
and 60-70 % of a trial (benchmarks/gpu); this split says which part a cheaper start must shrink.

vLLM states some durations itself ("Model loading took 13.49 GiB and 3.85 seconds", "torch.compile
took 18.40 s in total", "Graph capturing finished in 4 secs"); those are used as stated. The others
come from the lines' timestamps, which have one-second resolution, so they are good to about a second.
Process and imports is the time from launch to the first weight-loading line: the total startup (timed
by autotune from the launch to /health 200) minus what the log accounts for after that line.
"""

from __future__ import annotations

import re
from typing import Any

_STAMP = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG) \d\d-\d\d (\d\d):(\d\d):(\d\d)")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
_LOAD_START = re.compile(r"Loading model from scratch|Starting to load model|Initializing model took", re.I)
_MODEL_LOADED = re.compile(r"Model loading took[^\n]*?and\s*" + _NUM + r"\s*s", re.I)    # weights + model init
_WEIGHTS_LOADED = re.compile(r"Loading weights took\s*" + _NUM + r"\s*s", re.I)
_COMPILE = re.compile(r"torch\.compile took\s*" + _NUM + r"\s*s in total|\(compilation:\s*" + _NUM + r"\s*s\)", re.I)
_COMPILE_START = re.compile(r"Warming up model for the compilation", re.I)
_COMPILE_END = re.compile(r"saved AOT compiled function|Warming up done", re.I)
_PROFILED = re.compile(r"Initial profiling/warmup run took|torch\.compile took", re.I)
_KV = re.compile(r"KV cache size:", re.I)
_GRAPHS = re.compile(r"Graph capturing finished in\s*" + _NUM + r"\s*sec", re.I)
_READY = re.compile(r"Starting vLLM (?:API )?server on|Application startup complete", re.I)
PHASES = ("process_imports", "weights", "compile", "kv_profiling", "cuda_graphs", "other")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _lines(text: str) -> list[tuple[float | None, str]]:
    """(seconds since the first stamped line, line); continuation lines carry no stamp."""
    out: list[tuple[float | None, str]] = []
    first: float | None = None
    prev = 0.0
    for line in text.splitlines():
        m = _STAMP.search(line)
        t: float | None = None
        if m:
            t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
            if first is None:
                first = t
            t -= first
            while t < prev - 1:        # past midnight
                t += 86400
            prev = t
        out.append((t, line))
    return out


def _first(lines: list[tuple[float | None, str]], pattern: re.Pattern[str], stamped: bool = True,
           after: float = -1.0) -> tuple[float | None, re.Match[str] | None]:
    last_t: float | None = None
    for t, line in lines:
        if t is not None:
            last_t = t
        m = pattern.search(line)
        if m and (last_t is None or last_t >= after):
            if stamped and t is None:
                return last_t, m
            return t, m
    return None, None


def startup_phases(text: str, total_s: float | None = None) -> dict[str, float] | None:
    """Seconds per phase (PHASES, plus `total`), or None when the log shows no weight loading (a start
    that died earlier, or a server that is not vLLM)."""
    lines = _lines(text)
    t_load, _ = _first(lines, _LOAD_START)
    t_loaded, m_loaded = _first(lines, _MODEL_LOADED)
    if m_loaded is None:
        t_loaded, m_loaded = _first(lines, _WEIGHTS_LOADED)
    if t_load is None and t_loaded is None:
        return None
    t_load = t_load if t_load is not None else t_loaded
    assert t_load is not None
    out: dict[str, float] = {}
    out["weights"] = _num(m_loaded.group(1)) if m_loaded else 0.0
    _, m_comp = _first(lines, _COMPILE)
    if m_comp:
        out["compile"] = _num(next(g for g in m_comp.groups() if g))
    else:
        t0, _ = _first(lines, _COMPILE_START)
        t1, _ = _first(lines, _COMPILE_END, after=t0 if t0 is not None else -1.0)
        out["compile"] = max(0.0, t1 - t0) if t0 is not None and t1 is not None else 0.0
    t_prof, _ = _first(lines, _PROFILED)
    t_kv, _ = _first(lines, _KV)
    base = t_prof if t_prof is not None else (t_loaded if t_loaded is not None else t_load)
    out["kv_profiling"] = max(0.0, t_kv - base) if t_kv is not None else 0.0
    _, m_graphs = _first(lines, _GRAPHS)
    out["cuda_graphs"] = _num(m_graphs.group(1)) if m_graphs else 0.0
    t_ready, _ = _first(lines, _READY)
    after_load = (t_ready - t_load) if t_ready is not None else sum(out.values())
    if total_s is not None:
        out["process_imports"] = max(0.0, total_s - after_load)
        total = float(total_s)
    else:   # no launch time: only what the log shows (imports before its first line are not counted)
        out["process_imports"] = t_load
        total = t_load + after_load
    named = sum(out[k] for k in ("process_imports", "weights", "compile", "kv_profiling", "cuda_graphs"))
    out["other"] = max(0.0, total - named)
    result = {k: round(out[k], 2) for k in PHASES}
    result["total"] = round(total, 2)
    return result


def format_phases(phases: dict[str, Any]) -> str:
    """`start 83 s: imports 38, weights 3.9, compile 18.4, KV 3, graphs 4, other 15.8`."""
    short = {"process_imports": "imports", "weights": "weights", "compile": "compile", "kv_profiling": "KV",
             "cuda_graphs": "graphs", "other": "other"}
    parts = [f"{short[k]} {phases[k]:.3g}" for k in PHASES if phases.get(k) is not None]
    return f"start {phases.get('total', 0):.0f} s: " + ", ".join(parts)
