"""Regenerate the tables of benchmarks/gpu/RESULTS.md from the study DB of the H200 run.

Every number comes from the SQLite file (autotune_trials and autotune_studies, read with sqlite3 and
json, not through the store, so the report also reads a DB written by an older autotune), from
bandwidth.json (the measured copy bandwidth) and from llama8b-shaped-config.json (the model shape);
the simulator columns come from running autotune's in-process simulator on each trial's flags.

    .venv/bin/python benchmarks/gpu/report.py                      # print every table
    .venv/bin/python benchmarks/gpu/report.py --update benchmarks/gpu/RESULTS.md

`--update` rewrites only the blocks between `<!-- report:NAME -->` and `<!-- /report:NAME -->`, so
the prose around them stays as written.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from autotune.perfmodel import plan  # noqa: E402
from autotune.sim.inprocess import run as sim_run  # noqa: E402
from autotune.slo import SLO  # noqa: E402

Trial = dict[str, Any]
JSON_COLS = ("params", "flags", "objectives", "constraints", "metrics", "capacity", "telemetry", "startup",
             "hardware", "workload")


def load(db: Path) -> tuple[dict[str, Any], list[Trial]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    study = dict(con.execute("SELECT * FROM autotune_studies ORDER BY id LIMIT 1").fetchone())
    trials = []
    for row in con.execute("SELECT * FROM autotune_trials WHERE study_id = ? ORDER BY number", (study["id"],)):
        t = dict(row)
        for c in JSON_COLS:
            t[c] = json.loads(t[c]) if t[c] else None
        trials.append(t)
    study["spec"] = json.loads(study["spec"])
    return study, trials


def measured(trials: list[Trial]) -> list[Trial]:
    return [t for t in trials if t["state"] == "ok" and t["capacity"]]


def cache_evidence(log: Path) -> dict[str, Any]:
    """From a trial's vLLM log (gzip): prefix-cache resets that vLLM refused ("Failed to reset prefix
    cache") and the highest "Prefix cache hit rate" its 10 s stat lines printed. Random prompts should
    never hit the cache; a hit after a refused reset means a step replayed an earlier step's prompts."""
    import gzip
    text = gzip.open(log, "rt", errors="replace").read()
    rates = [float(x) for x in re.findall(r"Prefix cache hit rate: ([0-9.]+)%", text)]
    return {"failed_resets": text.count("Failed to reset prefix cache"), "max_hit_pct": max(rates, default=None)}


def flattered(t: Trial) -> bool:
    ev = t.get("cache")
    return bool(ev and ev["failed_resets"] and (ev["max_hit_pct"] or 0) > 0)


def fmt(x: Any, nd: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def pct(pred: float, real: float) -> str:
    return f"{(pred / real - 1) * 100:+.1f} %"


def short_params(t: Trial) -> str:
    if not t["flags"]:
        return "defaults (no flags)"
    names = {"gpu_memory_utilization": "gmu", "max_num_seqs": "seqs", "max_num_batched_tokens": "batched",
             "enable_chunked_prefill": "chunked", "enable_prefix_caching": "prefix"}
    def val(v: Any) -> str:
        return "on" if v is True else "off" if v is False else f"{v:g}" if isinstance(v, float) else str(v)
    return " ".join(f"{names.get(k, k)}={val(v)}" for k, v in t["params"].items())


def table(head: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# ---- sections --------------------------------------------------------------------------------------
def sec_facts(study: dict[str, Any], trials: list[Trial]) -> str:
    hw = trials[0]["hardware"]
    gpus = ", ".join(f"{g['name']} ({g['memory_mib']:,} MiB)" for g in hw["gpus"])
    versions = sorted({t["startup"].get("engine_version") for t in trials if t["startup"]} - {None})
    spec = study["spec"]
    started = min(t["started_at"] for t in trials)
    finished = max(t["finished_at"] or t["started_at"] for t in trials)
    lines = [
        f"- Hardware (DB `hardware`): {gpus}; {hw['cpu_count']} x {hw['cpu']}, {hw['memory_gib']} GiB RAM; "
        f"{hw['platform']}",
        f"- Engine: vLLM {', '.join(versions)} (from each started trial's `startup` record), command "
        f"`{' '.join(json.loads(study['engine_command']))}`, fixed flags `{' '.join(json.loads(study['fixed_flags']))}`",
        f"- Model: `{study['model']}`; weights in memory {sorted({t['startup']['model_memory_gib'] for t in trials if t['startup']})} GiB",
        f"- Workload: {json.dumps(trials[0]['workload'])}; load: {json.dumps(spec['load'])}",
        f"- SLO: `{study['slo']}`; objectives {json.loads(study['objectives'])}; telemetry "
        f"{json.dumps(spec['telemetry'])}",
        f"- Trials: {len(trials)} ({sum(t['state'] == 'ok' for t in trials)} measured), "
        f"first started {started[:19]}, last finished {finished[:19]} (UTC, DB clock)",
    ]
    return "\n".join(lines)


def sec_trials(study: dict[str, Any], trials: list[Trial]) -> str:
    rows = []
    for t in trials:
        cap = t["capacity"] or {}
        state = t["state"] + (f" / {t['cause']}" if t["cause"] else "")
        rows.append([t["number"], t["role"], state, short_params(t), bracket(cap),
                     fmt(t["objectives"].get("capacity_tps"), 0), fmt(t["metrics"].get("p99_ttft_ms"), 0),
                     fmt(t["metrics"].get("median_tpot_ms"), 2), fmt(t["kv_cache_tokens"]),
                     fmt(t["startup_seconds"], 1)] + ([_cache_cell(t)] if any("cache" in x for x in trials) else []))
    return table(["#", "role", "state / cause", "params", "capacity: met / first broken", "capacity_tps (out tok/s)",
                  "p99 TTFT ms", "p50 TPOT ms", "KV tokens", "startup s"]
                 + (["refused cache resets / max prefix hit % (vLLM log)"] if any("cache" in x for x in trials) else []),
                 rows)


def _cache_cell(t: Trial) -> str:
    ev = t.get("cache")
    if not ev:
        return "-"
    cell = f"{ev['failed_resets']} / {fmt(ev['max_hit_pct'], 1)}"
    return f"**{cell} FLATTERED**" if flattered(t) else cell


def bracket(cap: dict[str, Any]) -> str:
    """The capacity with the search's resolution: the highest load that met the SLO and the lowest
    that broke it above it (the true capacity lies between)."""
    if not cap:
        return "-"
    met = [s["load"] for s in cap["steps"] if s["slo_met"]]
    top = max(met, default=0.0)
    broke = [s["load"] for s in cap["steps"] if not s["slo_met"] and s["load"] > top]
    return f"{top:g} / {min(broke):g}" if broke else f"{top:g} / -"


def sec_telemetry(study: dict[str, Any], trials: list[Trial]) -> str:
    rows = []
    for t in trials:
        s = t["telemetry"]
        if not s:
            continue
        jpt = s.get("joules_per_token")
        peak = s["peak_mem_used_mib"] / 1024
        total = s["mem_total_mib"] / 1024
        rows.append([t["number"], s["source"], fmt(s["duration_s"], 1), fmt(s["mean_power_w"], 0), fmt(s["max_power_w"], 0),
                     fmt(s["energy_j"] / 1000, 1), fmt(jpt, 3), fmt(1 / jpt, 2) if jpt else "-",
                     fmt(s["mean_util_pct"], 0), f"{peak:.1f} / {total:.1f}", f"{(1 - peak / total) * 100:.1f} %",
                     fmt(s.get("peak_kv_usage_pct"), 1), ", ".join(s.get("throttle_reasons") or []) or "-"])
    return table(["#", "source", "window s", "mean W", "max W", "energy kJ", "J/token", "tokens/J", "GPU util %",
                  "peak mem GiB", "headroom", "peak KV use %", "throttle"], rows)


def sec_failures(study: dict[str, Any], trials: list[Trial]) -> str:
    rows = [[t["number"], t["state"], t["cause"], short_params(t), f"`{t['detail']}`",
             fmt(round((_ts(t['finished_at']) - _ts(t['started_at'])), 1) if t["finished_at"] else None, 1)]
            for t in trials if t["state"] != "ok"]
    return table(["#", "state", "cause", "params", "detail (DB `detail`)", "wall s"], rows)


def _ts(s: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(s).timestamp()


def _best_tuned(trials: list[Trial], key: Callable[[Trial], float]) -> Trial | None:
    tuned = [t for t in measured(trials) if t["role"] != "baseline" and not flattered(t)]
    return max(tuned, key=key, default=None)


def _steps(t: Trial) -> str:
    rows = [[fmt(s["load"], 0), "yes" if s["slo_met"] else "no", fmt(s["output_throughput"], 0),
             fmt(s["p99_ttft_ms"], 0), fmt(s["median_tpot_ms"], 2), s["completed"],
             "aborted early" if s["aborted_early"] else ""] for s in t["capacity"]["steps"]]
    return table(["concurrency", "SLO met", "out tok/s", "p99 TTFT ms", "p50 TPOT ms", "completed", ""], rows)


def sec_goodput(study: dict[str, Any], trials: list[Trial]) -> str:
    """The baseline beside the best tuned trial on capacity_tps and the one that held the SLO at the
    highest concurrency (they can differ: output tok/s at capacity is not monotone in concurrency
    when a step is only a few closed-loop waves long)."""
    base = next(t for t in measured(trials) if t["role"] == "baseline")
    by_tps = _best_tuned(trials, lambda t: t["objectives"]["capacity_tps"])
    by_cap = _best_tuned(trials, lambda t: (t["capacity"]["capacity"], t["objectives"]["capacity_tps"]))
    if by_tps is None or by_cap is None:
        return "No tuned trial was measured."
    cols = [base, by_tps] + ([by_cap] if by_cap is not by_tps else [])

    def row(label: str, get: Callable[[Trial], float], nd: int, ratio: bool = True) -> list[str]:
        b = get(base)
        return [label] + [fmt(get(t), nd) + (f" ({get(t) / b:.3f})" if ratio and t is not base else "") for t in cols]

    head = [""] + [f"baseline #{base['number']}"] + [f"best tuned on capacity_tps #{by_tps['number']}"] + (
        [f"highest tuned capacity #{by_cap['number']}"] if by_cap is not by_tps else [])
    out = [table(head, [
        row("capacity_tps: output tok/s at capacity, SLO held (ratio to baseline)",
            lambda t: t["objectives"]["capacity_tps"], 1),
        row("capacity: concurrency meeting the SLO", lambda t: t["capacity"]["capacity"], 0),
        row("request goodput at capacity, req/s meeting the SLO", lambda t: t["metrics"]["goodput"], 2),
        row("p99 TTFT ms at capacity", lambda t: t["metrics"]["p99_ttft_ms"], 0, False),
        row("p50 TPOT ms at capacity", lambda t: t["metrics"]["median_tpot_ms"], 2, False)])]
    for t in cols:
        out += ["", f"Capacity steps of #{t['number']} ({t['role']}, {short_params(t)}):", "", _steps(t)]
    for t in (t for t in measured(trials) if flattered(t)):
        out += ["", f"Left out above, flattered by the prefix cache: #{t['number']} ({short_params(t)}), recorded "
                f"capacity {fmt(t['capacity']['capacity'], 0)} and capacity_tps "
                f"{fmt(t['objectives']['capacity_tps'], 0)}; its vLLM log shows {t['cache']['failed_resets']} refused "
                f"cache reset(s) and prefix hit rates up to {t['cache']['max_hit_pct']:.1f} %. Its steps:", "", _steps(t)]
    same = _repeats(trials)
    if same:
        a, c = same
        out += ["", f"Repeat of one configuration (trials #{a['number']} and #{c['number']}, same params): "
                f"capacity_tps {fmt(a['objectives']['capacity_tps'], 0)} vs {fmt(c['objectives']['capacity_tps'], 0)} "
                f"({abs(a['objectives']['capacity_tps'] / c['objectives']['capacity_tps'] - 1) * 100:.1f} % apart) "
                "- the run-to-run spread to read the ratios against."]
    return "\n".join(out)


def _repeats(trials: list[Trial]) -> tuple[Trial, Trial] | None:
    ok = measured(trials)
    for i, a in enumerate(ok):
        for c in ok[i + 1:]:
            if a["params"] == c["params"]:
                return a, c
    return None


def weight_params(cfg: dict[str, Any]) -> dict[str, int]:
    """Exact parameter count of a Llama-shaped model (no biases, untied embeddings)."""
    h, L, v, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q = o = h * cfg["num_attention_heads"] * hd
    k = vv = h * cfg["num_key_value_heads"] * hd
    mlp = 3 * h * inter
    layer = q + k + vv + o + mlp + 2 * h       # two RMSNorm weights
    return {"embed": v * h, "lm_head": 0 if cfg.get("tie_word_embeddings") else v * h, "per_layer": layer,
            "layers": L * layer, "final_norm": h, "total": v * h * (1 if cfg.get("tie_word_embeddings") else 2) + L * layer + h}


def sec_roofline(study: dict[str, Any], trials: list[Trial], cfg: dict[str, Any], bw: dict[str, Any]) -> str:
    p = weight_params(cfg)
    wbytes = 2 * p["total"]
    gbs = bw["copy_bandwidth_gb_s"]
    roof = gbs * 1e9 / wbytes
    lines = [f"Parameters from the shape: embed {p['embed']:,} + lm_head {p['lm_head']:,} + {cfg['num_hidden_layers']} "
             f"layers x {p['per_layer']:,} (q, k, v, o, gate, up, down, 2 norms) + final norm {p['final_norm']:,} "
             f"= **{p['total']:,}** params = {wbytes:,} bytes in bf16 ({wbytes / 2**30:.2f} GiB).", "",
             f"HBM roofline, one stream: {gbs:,.0f} GB/s (measured copy, bandwidth.json, {bw['device']}) / "
             f"{wbytes / 1e9:.3f} GB = **{roof:.1f} tok/s** (a {1e3 / roof:.3f} ms floor per decoded token).", ""]
    rows = []
    for t in measured(trials):
        s = t["capacity"]["steps"][0]
        tpot = s["median_tpot_ms"]
        # A quantized config reads fewer bytes per token than the bf16 model: its own floor uses the
        # weight bytes vLLM reported loading for that trial.
        own_gib = t["startup"]["model_memory_gib"]
        own_roof = gbs * 1e9 / (own_gib * 2**30)
        rows.append([t["number"], short_params(t), fmt(s["load"], 0), s["completed"], fmt(s["output_throughput"], 1),
                     f"{s['output_throughput'] / roof * 100:.1f} %", fmt(tpot, 3), fmt(1e3 / tpot, 1),
                     f"{1e3 / tpot / roof * 100:.1f} %", f"{own_gib:.2f}",
                     f"{1e3 / tpot / own_roof * 100:.1f} %", fmt(s["p99_ttft_ms"], 1)])
    lines.append(table(["#", "params", "concurrency", "requests", "output tok/s", "of bf16 roofline", "p50 TPOT ms",
                        "decode tok/s (1000/TPOT)", "decode of bf16 roofline", "weights loaded GiB",
                        "decode of own-weights roofline", "p99 TTFT ms"], rows))
    return "\n".join(lines)


def _sim(model: str, flags: list[str], conc: int, n: int, input_len: int, output_len: int) -> dict[str, float]:
    p = plan(model, ["--max-model-len", "4096", *flags], "H200", 1)
    return sim_run(p, num_requests=n, input_len=input_len, output_len=output_len, concurrency=conc).metrics


def sim_capacity(model: str, flags: list[str], slo: SLO, n: int, input_len: int, output_len: int,
                 hi: int = 256) -> int:
    """Highest concurrency whose simulated step (same request count, first wave measured, as the
    real search) meets the SLO, by bisection; p99 TTFT grows with concurrency in a closed loop."""
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if slo.met(_sim(model, flags, mid, n, input_len, output_len)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def sec_sim(study: dict[str, Any], trials: list[Trial], model: str) -> str:
    slo = SLO.parse(study["slo"])
    wl = trials[0]["workload"]
    n = study["spec"]["load"]["requests_per_step"]
    kv_rows, run_rows = [], []
    for t in measured(trials):
        p = plan(model, ["--max-model-len", "4096", *t["flags"]], "H200", 1)
        kv_rows.append([t["number"], f"{p.config.gmu:.2f}", fmt(t["kv_cache_tokens"]), fmt(p.budget.kv_cache_tokens),
                        pct(p.budget.kv_cache_tokens, t["kv_cache_tokens"]),
                        fmt(t["startup"]["model_memory_gib"], 2), fmt(p.budget.weights_gib, 2)])
        probe = t["capacity"]["steps"][0]
        s1 = _sim(model, t["flags"], int(probe["load"]), probe["completed"], wl["input_len"], wl["output_len"])
        cap = int(t["capacity"]["capacity"])
        sc = _sim(model, t["flags"], cap, n, wl["input_len"], wl["output_len"])
        m = t["metrics"]
        pcap = sim_capacity(model, t["flags"], slo, n, wl["input_len"], wl["output_len"])
        run_rows.append([t["number"], fmt(probe["output_throughput"], 1), fmt(s1["output_throughput"], 1),
                         pct(s1["output_throughput"], probe["output_throughput"]),
                         f"{probe['median_tpot_ms']:.2f} / {s1['median_tpot_ms']:.2f}", cap,
                         fmt(m["output_throughput"], 0), fmt(sc["output_throughput"], 0),
                         pct(sc["output_throughput"], m["output_throughput"]),
                         f"{m['p99_ttft_ms']:.0f} / {sc['p99_ttft_ms']:.0f} ({pct(sc['p99_ttft_ms'], m['p99_ttft_ms'])})",
                         f"{m['median_tpot_ms']:.2f} / {sc['median_tpot_ms']:.2f} ({pct(sc['median_tpot_ms'], m['median_tpot_ms'])})",
                         f"{cap} / {pcap}"])
    base = next(t for t in measured(trials) if t["role"] == "baseline")
    recorded = base["params"].get("gpu_memory_utilization")
    note = ""
    if recorded is not None:
        pb = plan(model, ["--max-model-len", "4096", "--gpu-memory-utilization", str(recorded)], "H200", 1)
        note = (f"\n\nBaseline #{base['number']} ran with no flags (the sim then takes vLLM's default GMU "
                f"{plan(model, ['--max-model-len', '4096'], 'H200', 1).config.gmu:g}); at the GMU the DB records for it "
                f"({recorded:g}, the search space's default) the sim would give {pb.budget.kv_cache_tokens:,} KV tokens "
                f"({pct(pb.budget.kv_cache_tokens, base['kv_cache_tokens'])}).")
    return "\n".join([
        table(["#", "GMU", "real KV tokens", "sim KV tokens", "error", "real weights GiB", "sim weights GiB"], kv_rows) + note, "",
        table(["#", "real 1-stream tok/s", "sim 1-stream tok/s", "error", "p50 TPOT ms real / sim", "capacity C",
               "real tok/s at C", "sim tok/s at C", "error", "p99 TTFT ms real / sim at C", "p50 TPOT ms real / sim at C",
               "capacity real / sim"], run_rows)])


def sec_confirm(confirm_dir: Path) -> str:
    """Re-measurements outside the study: `autotune bench --json` files named
    confirm-<label>-c<concurrency>.json, each a longer closed-loop run (8 waves) than a capacity step."""
    rows = []
    for f in sorted(confirm_dir.glob("confirm-*-c*.json"), key=lambda f: (f.stem.rsplit("-c", 1)[0],
                                                                         int(f.stem.rsplit("-c", 1)[1]))):
        d = json.loads(f.read_text())
        slo = SLO.parse(d["slo"])
        rows.append([f.name, fmt(d["max_concurrency"]), d["completed"], d["failed"], fmt(d["duration"], 1),
                     fmt(d["output_throughput"], 0), fmt(d["median_ttft_ms"], 0), fmt(d["p99_ttft_ms"], 0),
                     fmt(d["median_tpot_ms"], 2), f"{d['slo_attainment_pct']:.1f} %", fmt(d["request_goodput"], 2),
                     "yes" if slo.met(d) else "no"])
    return table(["file", "concurrency", "completed", "failed", "duration s", "out tok/s", "p50 TTFT ms",
                  "p99 TTFT ms", "p50 TPOT ms", "SLO attainment", "goodput req/s", "p99 TTFT SLO met"], rows)


# ---- main ------------------------------------------------------------------------------------------
def build(db: Path, cfg_path: Path, bw_path: Path, confirm_dir: Path | None = None,
          logs: Path | None = None) -> dict[str, str]:
    study, trials = load(db)
    for t in trials:
        log = logs / f"trial-{t['number']:04d}.log.gz" if logs else None
        if log is not None and log.is_file():
            t["cache"] = cache_evidence(log)
    cfg = json.loads(cfg_path.read_text())
    bw = json.loads(bw_path.read_text())
    makers: dict[str, Callable[[], str]] = {
        "facts": lambda: sec_facts(study, trials),
        "trials": lambda: sec_trials(study, trials),
        "telemetry": lambda: sec_telemetry(study, trials),
        "failures": lambda: sec_failures(study, trials),
        "goodput": lambda: sec_goodput(study, trials),
        "roofline": lambda: sec_roofline(study, trials, cfg, bw),
        "sim": lambda: sec_sim(study, trials, str(cfg_path)),
    }
    if confirm_dir is not None:
        makers["confirm"] = lambda: sec_confirm(confirm_dir)
    return {k: f() for k, f in makers.items()}


def update(path: Path, blocks: dict[str, str]) -> None:
    text = path.read_text()
    for name, body in blocks.items():
        pat = re.compile(rf"(<!-- report:{name} -->\n).*?(\n<!-- /report:{name} -->)", re.S)
        if not pat.search(text):
            raise SystemExit(f"{path}: no <!-- report:{name} --> block")
        text = pat.sub(lambda m: m.group(1) + body + m.group(2), text)
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=HERE / "h200-llama8b.db")
    ap.add_argument("--config", type=Path, default=HERE / "llama8b-shaped-config.json")
    ap.add_argument("--bandwidth", type=Path, default=HERE / "bandwidth.json")
    ap.add_argument("--confirm", type=Path, help="a folder of confirm-*.json re-measurements to tabulate")
    ap.add_argument("--logs", type=Path, help="a folder of the trials' vLLM logs (trial-NNNN.log.gz)")
    ap.add_argument("--prefix", default="", help="block names get this prefix (two runs in one markdown file)")
    ap.add_argument("--update", type=Path, help="rewrite the report blocks of this markdown file")
    a = ap.parse_args()
    for p in (a.db, a.config, a.bandwidth):
        if not p.is_file():
            ap.error(f"{p}: no such file")
    blocks = {a.prefix + k: v for k, v in build(a.db, a.config, a.bandwidth, a.confirm, a.logs).items()}
    if a.update:
        update(a.update, blocks)
    else:
        for name, body in blocks.items():
            print(f"<!-- report:{name} -->\n{body}\n<!-- /report:{name} -->\n")


if __name__ == "__main__":
    main()
