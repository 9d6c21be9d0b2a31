"""A VLM study with image traffic on the labelled simulator (issue 25): real processes, HTTP and SQLite;
the twin's Qwen2.5-VL-7B serves images (their tokens in usage, the encoder's time in TTFT), the
multimodal knobs join the space and the spec's endpoint becomes chat, and the trial's figures are kept
per class. The same loop as the H200 study, seconds a trial."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path


def test_a_vlm_study_on_the_twin_measures_each_class(autotune_run, servers_in, sim_spec, tmp_path: Path) -> None:
    spec = sim_spec("vlm", model="qwen2.5-vl-7b", confirm={"enabled": False},
                    engine={"extra_flags": ["--max-model-len", "16384"], "gpu": "H200", "time_scale": 100},
                    load={"max_steps": 2},
                    workload={"kind": "image", "input_len": 256, "output_len": 32, "share": 0.5, "images": "1-2",
                              "sizes": "640x480/1024x768"},
                    slo="ttft[image]:p99<=3s,ttft[text]:p99<=1s")
    run = autotune_run(["run", "--study", str(spec), "--n-trials", "1", "--no-progress"], tmp_path)
    assert run.finish(300) == 0, "\n".join(run.lines)
    with sqlite3.connect(tmp_path / "vlm.db") as conn:
        rows = conn.execute("select number, state, cause, params, metrics, capacity from autotune_trials "
                            "order by number").fetchall()
        names = {n for (n,) in conn.execute("select param_name from trial_params")}
        (slo,), = conn.execute("select slo from autotune_studies").fetchall()
    assert slo == "ttft[image]:p99<=3000ms,ttft[text]:p99<=1000ms"
    baseline, = rows
    assert baseline[1] == "ok"
    assert {"limit_mm_per_prompt", "disable_chunked_mm_input"} <= names      # joined (a VLM), at vLLM's defaults
    m = json.loads(baseline[4])
    assert m["image_completed"] > 0 and m["text_completed"] > 0 and m["failed"] == 0
    # 640x480 is 393 tokens, 1024x768 1,001: the server's usage counted them into the image requests' prompts
    assert m["image_mean_input_tokens"] > m["text_mean_input_tokens"] + 393
    probe = json.loads(baseline[5])["steps"][0]        # one stream: nothing queues, an image costs its prefill
    assert probe["load"] == 1 and probe["image_median_ttft_ms"] > probe["text_median_ttft_ms"] + 10
    assert not servers_in(tmp_path, "sim-serve")
