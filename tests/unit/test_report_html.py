"""The HTML report and its parameter importance, on a real SQLite file holding an Optuna study beside
autotune's tables (no browser here: tests/integration/test_report_sim.py opens a real one)."""

from __future__ import annotations

import json
import re

import optuna
import plotly.offline

from autotune.cli import main
from autotune.report.html import render_report
from autotune.report.importance import measured_study, param_importances
from autotune.store.repository import ResultStore

PLACEHOLDER = -4242.5   # what a failed trial is told to Optuna here; must never reach a figure


def _study(tmp_path, simulated: bool):
    url = f"sqlite:///{tmp_path}/r.db"
    store = ResultStore(url)
    rec = store.ensure_study(
        name="imp", model="m", engine_kind="sim" if simulated else "vllm", engine_command=["vllm", "serve"],
        fixed_flags=[], space_hash="h", spec_hash="x", spec={}, slo="ttft:p99<=1000ms", quality_knobs=[],
        objectives=[["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]])
    ost = optuna.create_study(study_name="imp", storage=url, directions=["maximize", "minimize"])
    dists = {"gpu_memory_utilization": optuna.distributions.FloatDistribution(0.5, 0.95),
             "max_num_seqs": optuna.distributions.IntDistribution(1, 512)}
    for n in range(14):
        gmu, seqs = 0.5 + 0.03 * n, [8, 300, 64, 500, 16, 128, 32, 256, 200, 48, 96, 400, 24, 12][n]
        failed = n in (3, 11)
        # capacity follows gpu_memory_utilization only; the failures all ran large max_num_seqs
        cap = 1000.0 * gmu if not failed else PLACEHOLDER
        ost.add_trial(optuna.trial.create_trial(params={"gpu_memory_utilization": gmu, "max_num_seqs": seqs},
                                                distributions=dists, values=[cap, 10.0 + (n % 3)]))
        store.save_trial(rec.id, n, optuna_trial_id=n, role="baseline" if n == 0 else "search",
                         state="failed" if failed else "ok", cause="runtime_oom" if failed else None,
                         params={"gpu_memory_utilization": gmu, "max_num_seqs": seqs}, flags=[], spec_hash="x",
                         objectives={} if failed else {"capacity_tps": cap, "p50_tpot_ms": 10.0 + (n % 3)},
                         constraints={"slo:ttft:p99": 0.0 if failed else -5.0, "failure": 1.0 if failed else 0.0},
                         capacity=None if failed else {"mode": "concurrency", "capacity": 4.0 + n, "steps": [
                             {"load": 1.0, "slo_met": True, "p99_ttft_ms": 100.0, "output_throughput": 50.0},
                             {"load": 4.0 + n, "slo_met": True, "p99_ttft_ms": 900.0, "output_throughput": cap}]},
                         metrics={} if failed else {"p99_ttft_ms": 900.0}, simulated=simulated,
                         engine_version="0.32.0", hardware={"cpu": "x"}, workload={"kind": "random"})
    return store, store.resolve_study(None)


def test_importance_reads_measured_trials_only(tmp_path):
    store, study = _study(tmp_path, simulated=False)
    trials = store.trials(study.id)
    mem = measured_study(store.url, study, trials)
    assert sorted(t.user_attrs["number"] for t in mem.trials) == [n for n in range(14) if n not in (3, 11)]
    assert all(t.values[0] != PLACEHOLDER for t in mem.trials)
    imp, note = param_importances(store.url, study, trials)
    assert note.startswith("over 12 measured trials")
    assert imp["capacity_tps"]["gpu_memory_utilization"] > imp["capacity_tps"]["max_num_seqs"]


def test_report_labels_marks_and_leaves_placeholders_out(tmp_path):
    store, study = _study(tmp_path, simulated=True)
    page = render_report(store, study)
    assert page.count('class="sim"') == 1 and "(SIMULATED)</title>" in page
    own = page.replace(plotly.offline.get_plotlyjs(), "")                 # plotly's JavaScript is inline,
    assert plotly.offline.get_plotlyjs() in page and not re.search(r"<script[^>]+src=", own)   # nothing fetched
    assert str(PLACEHOLDER) not in page
    # every trace's hover names trial numbers; the exported trial (best capacity, 13) is marked
    figs = [json.loads(m) for m in re.findall(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', page, re.S)]
    assert len(figs) == 5                       # pareto, history, importance, failures, steps (no telemetry kept)
    assert "exported: trial 13" in page and "baseline (vLLM defaults): trial 0" in page
    hover_traces = [t for f in figs for t in f if t.get("customdata") is not None]
    assert hover_traces and all("trial %{customdata}" in t["hovertemplate"] or "trials %{customdata}"
                                in t["hovertemplate"] for t in hover_traces)
    assert "runtime_oom" in page and "not confirmed" in page
    (tmp_path / "real").mkdir()
    assert "SIMULATED" not in render_report(*_study(tmp_path / "real", simulated=False))


def test_the_exported_trial_s_least_free_memory_over_its_runs_is_shown(tmp_path):
    """Confirmation repeats keep telemetry: the report gives the worst run's free memory beside the
    confirmed figures, and which run it was (here a repeat, not the first run)."""
    store, study = _study(tmp_path, simulated=False)
    total = 81_559.0
    for n, first, reps in ((0, 70_000.0, (71_000.0, 70_500.0, 70_800.0)), (13, 74_000.0, (74_100.0, 78_500.0, 74_200.0))):
        store.save_trial(study.id, n, telemetry={"source": "nvml", "peak_mem_used_mib": first, "mem_total_mib": total})
        trial = next(t for t in store.trials(study.id) if t.number == n)
        for r, peak in enumerate(reps):
            store.save_confirmation(study_id=study.id, trial_id=trial.id, round=r, position=0, seed=r, state="ok",
                                    objectives={"capacity_tps": 1000.0 + n, "p50_tpot_ms": 10.0},
                                    constraints={"slo:ttft:p99": -5.0}, capacity={"capacity": 8},
                                    telemetry={"source": "nvml", "peak_mem_used_mib": peak, "mem_total_mib": total})
    page = render_report(store, study)
    assert "exported: trial 13" in page
    assert "peak memory over 4 runs: least free 3.8% (round-2 repeat)" in page


def test_report_command_errors_are_one_line(tmp_path, capsys):
    store, _ = _study(tmp_path, simulated=True)
    assert main(["report", "--storage", store.url, "-o", str(tmp_path / "no" / "r.html")]) == 2
    assert main(["report", "--storage", f"sqlite:///{tmp_path}/none.db", "-o", str(tmp_path / "r.html")]) == 2
    assert main(["run", "--model", "x", "--report", str(tmp_path / "no" / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "Traceback" not in err
    assert main(["report", "--storage", store.url, "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 1_000_000    # plotly's JavaScript is inside
