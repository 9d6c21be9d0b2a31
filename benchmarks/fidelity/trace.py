#!/usr/bin/env python3
"""Where a fidelity gap comes from, for every cell of a pass that recorded the server's own counters
(pass c on): how much of autotune / vLLM is the server running at another speed during the two clients'
runs, and how much is left for the clients' reading of it.

For each run, vLLM's own histograms (read from `/metrics` before and after the run) give the server's
mean TTFT and mean time per output token over exactly that run's requests. Per cell and metric:

- `clients`: autotune / vLLM on the medians over each client's runs (the fidelity table's figure);
- `server`: the same ratio of the server's own figures over the same runs: mean TPOT for the TPOT
  metrics, mean TTFT for the TTFT metrics, and for output throughput the inverse ratio of the server's
  time per request, TTFT + (output_len - 1) x TPOT (a closed loop's throughput is concurrency x tokens
  over that time; an open loop's is set by its arrival rate, so its server figure is 1);
- `left`: clients / server, the part of the gap the server's own clock does not show. Within 5 %: the
  gap is the server's speed during the runs, which both clients read alike.

The server's counters also count each run's warm-up requests (the cell's `warmup`, the same for both
clients). At 16 streams those are 16 requests sent at once whose first tokens wait for each other's
prefills, so there the server's mean TTFT sits above what either client measured over its counted
requests (negative offsets): the ratio still compares like with like, the offset in ms does not.

    .venv/bin/python benchmarks/fidelity/trace.py benchmarks/fidelity/pass-c.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fidelity import KEYS, cell_name, grid  # noqa: E402


def _server_figure(r: dict, key: str) -> float:
    """The server's own counterpart of a client metric for one run (larger = slower, like the metric,
    except throughput, where the server's time per request is inverted)."""
    if "tpot" in key:
        return r["server_mean_tpot_ms"]
    if "ttft" in key:
        return r["server_mean_ttft_ms"]
    if r.get("rate") is not None:      # an open loop's throughput follows its arrivals, not the server
        return 1.0
    per_request_ms = r["server_mean_ttft_ms"] + (r["output_len"] - 1) * r["server_mean_tpot_ms"]
    return 1.0 / per_request_ms


def trace(runs: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for c in grid():
        name = cell_name(c)
        rs = [r for r in runs if r["cell"] == name]
        if not rs:
            continue
        cell = {}

        def med(who: str, f) -> float:
            return median(f(r) for r in rs if r["client"] == who)
        for k in KEYS:
            clients = med("autotune", lambda r: r[k]) / med("vllm", lambda r: r[k])
            server = med("autotune", lambda r: _server_figure(r, k)) / med("vllm", lambda r: _server_figure(r, k))
            cell[k] = {"clients": clients, "server": server, "left": clients / server}
        # each client's own reading error against the server, over its runs (median)
        for who in ("autotune", "vllm"):
            cell[f"{who}_tpot_reading"] = {"ratio": med(who, lambda r: r["mean_tpot_ms"] / r["server_mean_tpot_ms"])}
            cell[f"{who}_ttft_offset_ms"] = {"ms": med(who, lambda r: r["mean_ttft_ms"] - r["server_mean_ttft_ms"])}
        out[name] = cell
    return out


def table(doc: dict) -> str:
    t = trace(doc["runs"])
    head = ("| cell | " + " | ".join(f"{k}: clients / server / left" for k in KEYS)
            + " | mean TPOT read / server (autotune, vLLM) | mean TTFT minus server's, ms (autotune, vLLM) |")
    lines = [head, "|" + "---|" * (len(KEYS) + 3)]
    worst = {"means": (0.0, ""), "medians": (0.0, "")}
    for name, cell in t.items():
        row = [name]
        for k in KEYS:
            x = cell[k]
            kind = "medians" if k.startswith("median") else "means"
            if abs(x["left"] - 1) > worst[kind][0]:
                worst[kind] = (abs(x["left"] - 1), f"{name} {k}")
            left = f"**{x['left']:.3f}**" if abs(x["left"] - 1) > 0.05 else f"{x['left']:.3f}"
            row.append(f"{x['clients']:.3f} / {x['server']:.3f} / {left}")
        row.append(f"{cell['autotune_tpot_reading']['ratio']:.3f}, {cell['vllm_tpot_reading']['ratio']:.3f}")
        row.append(f"{cell['autotune_ttft_offset_ms']['ms']:.2f}, {cell['vllm_ttft_offset_ms']['ms']:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(f"Pass {doc['pass']} ({doc['date']}): the largest part not shown by the server's own clock, "
                 f"on the means and throughput (the statistics its counters give): {100 * worst['means'][0]:.1f} % "
                 f"({worst['means'][1]}); on the medians, against the server's means: "
                 f"{100 * worst['medians'][0]:.1f} % ({worst['medians'][1]}). Bold: over 5 %.")
    return "\n".join(lines)


def main() -> None:
    for p in sys.argv[1:] or [str(HERE / "pass-c.json")]:
        print(table(json.loads(Path(p).read_text())))


if __name__ == "__main__":
    main()
