"""`autotune convert`: a request log to the canonical trace that `trace:path=FILE` replays.

    autotune convert gateway.jsonl -o trace.jsonl --tokenizer /models/llama --lengths-only --window 0:3600
    autotune convert sharegpt.json -o trace.jsonl --tokenizer /models/llama --rate 2 --think 5 --sample 500
    autotune convert lengths.csv -o trace.jsonl

Formats: `openai` (request/response logs, JSON lines), `sharegpt`, `csv` (timestamp, input tokens,
output tokens); found from the file when `--from` is not given. The cut happens in this order: `--window`
(a time slice, exact), then `--sample` (whole conversations at random, at their recorded times; see
cut.py for what it keeps), then `--lengths-only` (private.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from autotune.bench.profile import describe, format_profile
from autotune.bench.tokens import load_tokenizer
from autotune.bench.trace.conversations import Timed, link_turns
from autotune.bench.trace.csv_log import read_csv_log
from autotune.bench.trace.cut import parse_window, sample, window
from autotune.bench.trace.fields import TokenCounter
from autotune.bench.trace.format import UNKNOWN_SIZE, TraceRecord, write_trace
from autotune.bench.trace.openai_log import read_openai_log
from autotune.bench.trace.private import lengths_only
from autotune.bench.trace.sharegpt import read_sharegpt
from autotune.cli import OneLineParser
from autotune.errors import UserError, one_line_errors

FORMATS = ("openai", "sharegpt", "csv")


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="autotune convert", description="Convert a request log to autotune's trace format "
                      "(replayed with --workload trace:path=OUT).")
    p.add_argument("source", help="the log: OpenAI-style request/response JSON lines, ShareGPT, or a CSV of "
                                  "timestamp,input_tokens,output_tokens")
    p.add_argument("-o", "--output", required=True, help="the trace to write (JSON lines)")
    p.add_argument("--from", dest="fmt", choices=FORMATS, help="the log's format (default: found from the file)")
    p.add_argument("--tokenizer", help="the model's directory or tokenizer.json: token counts (else the log's "
                                       "usage counts, else about 4 characters a token)")
    p.add_argument("--lengths-only", action="store_true", help="replace every text by synthetic text of the "
                   "same token length, keeping which requests share a prefix")
    p.add_argument("--window", help="START:END seconds after the log's first request (e.g. 0:3600)")
    p.add_argument("--sample", type=int, help="keep about N requests: whole conversations at random, recorded times")
    p.add_argument("--seed", type=int, default=0, help="for --sample, --lengths-only and ShareGPT arrivals")
    p.add_argument("--rate", type=float, default=1.0, help="ShareGPT: conversations started per second (Poisson)")
    p.add_argument("--think", type=float, default=0.0, help="ShareGPT: seconds between an answer and the next turn")
    return p


def main(argv: list[str]) -> int:
    return one_line_errors("autotune convert", _run, build_parser().parse_args(argv))


def detect_format(path: Path) -> str:
    if path.suffix.lower() == ".csv":
        return "csv"
    try:
        with path.open(encoding="utf-8") as f:
            head = f.read(65536).lstrip()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {str(path)!r}: {getattr(e, 'strerror', None) or e}") from None
    if head.startswith("["):
        return "sharegpt"
    first = head.split("\n", 1)[0]
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        raise UserError(f"{path.name}: neither JSON lines nor a .csv; give --from") from None
    return "sharegpt" if isinstance(obj, dict) and ("conversations" in obj or "conversation" in obj) else "openai"


def read_log(path: Path, fmt: str, counter: TokenCounter, *, rate: float, think: float, seed: int) -> list[TraceRecord]:
    """The log's requests as trace records, sorted, times from the first request, turns linked."""
    if fmt == "csv":
        items = read_csv_log(path)
    elif fmt == "sharegpt":
        items = read_sharegpt(path, counter, rate=rate, think_s=think, seed=seed)
    else:
        items = read_openai_log(path, counter)
    items.sort(key=lambda it: it.record.t)
    t0 = items[0].record.t
    for it in items:
        it.record.t -= t0
        it.end_t = None if it.end_t is None else it.end_t - t0
    if fmt == "openai":
        link_turns(items)
    return [it.record for it in items]


def _run(args) -> int:  # type: ignore[no-untyped-def]
    src, out = Path(args.source), Path(args.output)
    if not src.is_file():
        raise UserError(f"{args.source!r}: no such file")
    if out.resolve() == src.resolve():
        raise UserError("--output must not be the source log")
    if not args.rate > 0 or args.think < 0:
        raise UserError("--rate must be > 0 and --think >= 0")
    span = parse_window(args.window) if args.window else None
    tok = load_tokenizer(args.tokenizer) if args.tokenizer else None
    counter = TokenCounter(tok)
    fmt = args.fmt or detect_format(src)
    records = read_log(src, fmt, counter, rate=args.rate, think=args.think, seed=args.seed)
    n_read = len(records)
    if span is not None:
        records = window(records, *span)
    if args.sample is not None:
        records = sample(records, args.sample, args.seed)
    if args.lengths_only:
        records = lengths_only(records, tok, args.seed)
    header = {"source": fmt, "lengths_only": bool(args.lengths_only),
              "counted_with": "tokenizer" if tok is not None else
              ("approximate: 4 characters a token" if counter.approximate else "the log's usage counts"),
              "window": args.window, "sample": args.sample, "seed": args.seed}
    write_trace(out, records, header)
    from autotune.bench.workloads import TraceWorkload
    images = [img for r in records for img in r.images or ()]
    unknown = sum(1 for img in images if img.get("width") is None)
    print(f"wrote {out}: {len(records)} of {n_read} requests ({fmt}"
          + (", lengths only" if args.lengths_only else "") + ")"
          + (f", {len(images)} images in {sum(1 for r in records if r.images)} requests" if images else "")
          + (f" ({unknown} of unknown size, given by URL: replayed at {UNKNOWN_SIZE[0]}x{UNKNOWN_SIZE[1]})"
             if unknown else ""))
    print(format_profile(describe(TraceWorkload(str(out)).one_pass(tok), tok)))
    return 0
