"""A CSV of (timestamp, input tokens, output tokens): what a gateway's access log or a billing export
usually holds. A header names the columns (`timestamp`/`time`/`ts`, `input_tokens`/`prompt_tokens`,
`output_tokens`/`completion_tokens`, in any order); without one the first three columns are taken in
that order. No text: prompts are made at replay time at each request's length."""

from __future__ import annotations

import csv
from pathlib import Path

from autotune.bench.trace.conversations import Timed
from autotune.bench.trace.fields import parse_time
from autotune.bench.trace.format import TraceRecord
from autotune.errors import UserError

_NAMES = {"time": ("timestamp", "time", "ts", "start_time", "arrival", "t"),
          "in": ("input_tokens", "prompt_tokens", "input", "in_tokens", "tokens_in"),
          "out": ("output_tokens", "completion_tokens", "output", "out_tokens", "tokens_out")}


def read_csv_log(path: Path) -> list[Timed]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"cannot read {str(path)!r}: {getattr(e, 'strerror', None) or e}") from None
    if not rows:
        raise UserError(f"{path.name}: empty CSV")
    cols = _columns(rows[0])
    body = rows[1:] if cols is not None else rows
    cols = cols or (0, 1, 2)
    out = []
    for i, row in enumerate(body, 2 if len(body) < len(rows) else 1):
        where = f"{path.name}: row {i}"
        if len(row) <= max(cols):
            raise UserError(f"{where}: expected at least {max(cols) + 1} columns")
        t = parse_time(row[cols[0]], where)
        n_in, n_out = _int(row[cols[1]], where, "input tokens"), _int(row[cols[2]], where, "output tokens")
        out.append(Timed(TraceRecord(t=t, output_tokens=n_out, input_tokens=n_in)))
    if not out:
        raise UserError(f"{path.name}: no request rows")
    return out


def _columns(header: list[str]) -> tuple[int, int, int] | None:
    names = [h.strip().lower() for h in header]
    found = []
    for key in ("time", "in", "out"):
        idx = next((names.index(n) for n in _NAMES[key] if n in names), None)
        if idx is None:
            if any(n.replace(".", "").isdigit() for n in names):
                return None   # the first row is data
            raise UserError(f"CSV header {header!r}: no column for {key} (e.g. {', '.join(_NAMES[key][:2])})")
        found.append(idx)
    return found[0], found[1], found[2]


def _int(text: str, where: str, what: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise UserError(f"{where}: {what} {text[:20]!r} is not a number") from None
    if v < 1 or v != int(v):
        raise UserError(f"{where}: {what} must be a whole number >= 1, got {text.strip()}")
    return int(v)
