"""Image traffic against the real vLLM CPU build serving the demo VLM (issue 25; the shared session
server `vlm_server`): the server's own prompt-token counts hold each image's expected tokens, its
--limit-mm-per-prompt refuses a third image, and `autotune bench` reports image and text requests apart
in its text and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.bench.client import StreamClient
from autotune.bench.command import main as bench
from autotune.bench.images import made_image
from autotune.bench.tokens import load_tokenizer
from autotune.bench.workloads import Prompt, parse_workload
from autotune.perfmodel.vision import load_vision

pytestmark = pytest.mark.vllm


async def test_the_servers_prompt_tokens_hold_each_images_expected_tokens(vlm_server) -> None:
    vision = load_vision(vlm_server.model)
    assert vision is not None and vision.family == "idefics3"
    w = parse_workload("image:input_len=24,output_len=4,images=1-2,sizes=448x448/1024x256/300x900")
    prompts = w.prompts(8, seed=3)
    assert {(i.width, i.height) for p in prompts for i in p.images} == {(448, 448), (1024, 256), (300, 900)}
    async with StreamClient(vlm_server.url, vlm_server.model, endpoint="chat",
                            tokenizer=load_tokenizer(None, vlm_server.model)) as client:
        for p in prompts:
            with_images = await client.request(p)
            text_only = await client.request(Prompt(p.text, p.output_len, p.input_tokens))
            assert with_images.ok and text_only.ok, (with_images.error, text_only.error)
            measured = with_images.input_tokens - text_only.input_tokens      # usage.prompt_tokens, server's own
            expected = sum(vision.tokens(i.width, i.height) for i in p.images)
            print(f"images {[(i.width, i.height) for i in p.images]}: server {measured} tokens, expected {expected}")
            assert abs(measured - expected) <= 0.05 * expected, (measured, expected, [(i.width, i.height) for i in p.images])
        three = Prompt("three pictures", 4, images=tuple(made_image(64, 64, seed=s) for s in range(3)))
        refused = await client.request(three)
    assert not refused.ok and "HTTP 400" in refused.error and "2" in refused.error    # --limit-mm-per-prompt image 2


def test_bench_reports_image_and_text_requests_apart(vlm_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    code = bench(["--url", vlm_server.url, "--model", vlm_server.model, "--workload",
                  "image:input_len=32,output_len=8,share=0.5,images=1-2,sizes=448x448/1024x256", "--concurrency", "4",
                  "--num-requests", "16", "--warmup", "2", "--slo", "ttft[image]:p99<=60s,ttft[text]:p99<=60s",
                  "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "Requests by class" in text and "Images per second:" in text and "images: " in text   # result and profile
    x = json.loads(out.read_text())
    assert x["endpoint_type"] == "chat" and x["failed"] == 0
    assert x["image_completed"] + x["text_completed"] == 16 and x["image_completed"] > 0 and x["text_completed"] > 0
    assert x["images_per_s"] > 0 and x["total_images"] >= x["image_completed"]
    assert x["image_p99_ttft_ms"] > 0 and x["text_p99_ttft_ms"] > 0 and x["slo_attainment_pct"] == 100.0
    # an image of 1024x256 is 201 tokens, one of 448x448 335: the image class's prompts are far longer
    assert x["image_mean_input_tokens"] > x["text_mean_input_tokens"] + 150
    assert sorted({r["images"] for r in x["requests"]}) in ([0, 1, 2], [0, 1], [0, 2])
    assert x["workload_profile"]["images"]["max_per_request"] <= 2
