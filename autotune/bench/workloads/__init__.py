"""Workloads: what each request asks. One small base, one module per kind, `parse_workload` for both
spellings (`KIND:key=value,...` on the command line, the same mapping in a study)."""

from __future__ import annotations

from typing import Any, Mapping

from autotune.bench.workloads._base import Prompt, Workload
from autotune.bench.workloads._image import ImageWorkload
from autotune.bench.workloads._jsonl import JsonlWorkload
from autotune.bench.workloads._prefix import PrefixWorkload
from autotune.bench.workloads._random import RandomWorkload
from autotune.bench.workloads._trace import TraceWorkload
from autotune.errors import UserError

KINDS: dict[str, type[Workload]] = {w.kind: w for w in (RandomWorkload, JsonlWorkload, PrefixWorkload, TraceWorkload,
                                                       ImageWorkload)}


def parse_workload(spec: str | Mapping[str, Any]) -> Workload:
    """`random:input_len=300,output_len=40` or `{kind: random, input_len: 300, output_len: 40}`."""
    if isinstance(spec, Workload):
        return spec
    if isinstance(spec, str):
        mapping = _parse_text(spec)
    elif isinstance(spec, Mapping):
        mapping = dict(spec)
    else:
        raise UserError(f"workload must be KIND:key=value,... or a mapping, got {type(spec).__name__}")
    kind = mapping.pop("kind", None)
    if kind not in KINDS:
        raise UserError(f"workload kind {kind!r} is unknown (one of {', '.join(KINDS)})")
    cls = KINDS[kind]
    unknown = [k for k in mapping if k not in cls.keys]
    if unknown:
        raise UserError(f"workload {kind}: unknown key {unknown[0]!r} (keys: {', '.join(cls.keys)})")
    try:
        return cls(**mapping)
    except TypeError:
        missing = [k for k in cls.keys if k not in mapping]
        raise UserError(f"workload {kind}: missing {', '.join(missing)}") from None


def _parse_text(text: str) -> dict[str, Any]:
    kind, _, rest = text.strip().partition(":")
    out: dict[str, Any] = {"kind": kind.strip()}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"workload {text!r}: {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


__all__ = ["ImageWorkload", "JsonlWorkload", "KINDS", "PrefixWorkload", "Prompt", "RandomWorkload", "TraceWorkload", "Workload",
           "parse_workload"]
