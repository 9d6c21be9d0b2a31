"""Image requests over real HTTP on loopback, against the mock server whose image cost is known (each
image adds prompt tokens and time before the first token): the capacity search judges each class by its
own SLO term and reports the classes apart in text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.bench import find_capacity, parse_workload, run_load
from autotune.bench.command import main as bench
from autotune.bench.mockserver import MockConfig, build_app, serve
from autotune.bench.report import format_capacity
from autotune.errors import UserError
from autotune.slo import SLO

W = parse_workload("image:input_len=20,output_len=8,share=0.5,images=1-2,sizes=64x64/96x64")


async def test_each_class_answers_to_its_own_term() -> None:
    async with serve(build_app(MockConfig(mode="stream", itl_ms=1, image_ms=150, image_tokens=100))) as url:
        loose = await find_capacity(url, "mock", W, SLO.parse("ttft[image]:p99<=2s,ttft[text]:p99<=1s"),
                                    search="concurrency", max_steps=2, requests_per_step=16, warmup=2, upper=4,
                                    endpoint="chat")
        tight = await find_capacity(url, "mock", W, SLO.parse("ttft[image]:p99<=100ms,ttft[text]:p99<=1s"),
                                    search="concurrency", max_steps=2, requests_per_step=40, warmup=2, endpoint="chat")
    assert loose.capacity is not None
    x = loose.at_capacity.metrics
    assert x["image_median_ttft_ms"] > 150 > x["text_median_ttft_ms"]          # an image costs 150 ms before a token
    assert x["image_mean_input_tokens"] > x["text_mean_input_tokens"] + 100
    # every image request breaks 100 ms while text requests hold: the image term alone sinks the first step
    assert tight.capacity is None and not tight.steps[0].slo_met
    assert tight.steps[0].measurement.metrics["text_p99_ttft_ms"] < 100
    text = format_capacity(loose)
    assert "p99 TTFT image" in text and "Requests by class" in text
    body = loose.to_json()
    assert body["at_capacity"]["image_completed"] > 0 and "image_p99_ttft_ms" in body["steps"][0]


async def test_images_need_the_chat_endpoint() -> None:
    async with serve(build_app(MockConfig(mode="stream"))) as url:
        with pytest.raises(UserError, match="chat endpoint"):
            await run_load(url, "mock", W, concurrency=2, num_requests=4, endpoint="completions")


def test_bench_command_picks_chat_for_images_and_checks_class_terms(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio
    import threading

    ready, stop = threading.Event(), threading.Event()
    box: dict[str, str] = {}

    def host() -> None:
        async def main() -> None:
            async with serve(build_app(MockConfig(mode="stream", image_tokens=50))) as url:
                box["url"] = url
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)
        asyncio.run(main())

    t = threading.Thread(target=host, daemon=True)
    t.start()
    try:
        assert ready.wait(30)
        out = tmp_path / "o.json"
        assert bench(["--url", box["url"], "--model", "mock", "--workload", str(W), "--concurrency", "2",
                      "--num-requests", "8", "--json", str(out)]) == 0
        x = json.loads(out.read_text())
        assert x["endpoint_type"] == "chat" and x["image_completed"] + x["text_completed"] == 8
        assert bench(["--url", box["url"], "--model", "mock", "--workload", "random:input_len=8,output_len=4",
                      "--concurrency", "2", "--slo", "ttft[image]=1s"]) == 2
        assert "sends no images" in capsys.readouterr().err
    finally:
        stop.set()
        t.join(10)
