"""Images in the traffic (issue 25): made images decode to their size, headers are read without
decoding, the image workload's mix is seeded, the SLO grammar bounds a class, and the figures of
requests with and without images are kept apart."""

from __future__ import annotations

import io

import numpy as np
import pytest

from autotune.bench.client import StreamClient, chat_messages
from autotune.bench.images import (ImageRef, data_uri, decode_data_uri, image_size, made_image, make_image,
                                   parse_size, uri_size)
from autotune.bench.metrics import slo_margins, summarize
from autotune.bench.results import RequestRecord
from autotune.bench.workloads import Prompt, parse_workload
from autotune.errors import UserError
from autotune.slo import SLO, SLOError, check_slo_classes


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
@pytest.mark.parametrize("size", [(1, 1), (17, 33), (448, 448), (1024, 768)])
def test_made_images_decode_to_their_size_and_differ_by_seed(fmt: str, size: tuple[int, int]) -> None:
    Image = pytest.importorskip("PIL.Image")
    data = make_image(*size, seed=7, fmt=fmt)
    img = Image.open(io.BytesIO(data))
    img.load()
    assert img.size == size and img.format == fmt.upper()
    assert image_size(data) == (*size, fmt)
    assert make_image(*size, seed=7, fmt=fmt) == data                 # seeded
    if size[0] * size[1] > 256:                                       # more than one block of pixels
        assert make_image(*size, seed=8, fmt=fmt) != data


def test_png_pixels_are_the_ones_written() -> None:
    Image = pytest.importorskip("PIL.Image")
    from autotune.bench.images import _pixels

    data = make_image(100, 70, seed=3, fmt="png")
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), _pixels(100, 70, 3))


def test_headers_of_other_formats_and_data_uris() -> None:
    Image = pytest.importorskip("PIL.Image")
    for fmt, kw in (("GIF", {}), ("WEBP", {}), ("WEBP", {"lossless": True}), ("JPEG", {"progressive": True})):
        buf = io.BytesIO()
        Image.new("RGB", (123, 45)).save(buf, fmt, **kw)
        assert image_size(buf.getvalue())[:2] == (123, 45), fmt
    uri = data_uri(make_image(5, 7, 0), "png")
    assert uri.startswith("data:image/png;base64,") and uri_size(uri) == (5, 7, "png")
    assert decode_data_uri("https://example.com/cat.png") is None and uri_size("https://example.com/x") is None
    assert image_size(b"not an image at all") is None


def test_image_sizes_are_checked() -> None:
    assert parse_size("1024x768", "w") == (1024, 768)
    for bad in ("1024", "0x5", "5x99999", "axb"):
        with pytest.raises(UserError):
            parse_size(bad, "w")


def test_image_workload_mix_is_seeded_and_round_trips() -> None:
    w = parse_workload("image:input_len=32,output_len=8,share=0.3,images=1-2,sizes=448x448/1024x768")
    assert w.max_images == 2 and set(w.image_sizes) == {(448, 448), (1024, 768)}
    a, b = w.prompts(200, seed=5), w.prompts(200, seed=5)
    assert [[i.url for i in p.images] for p in a] == [[i.url for i in p.images] for p in b]
    carrying = [p for p in a if p.images]
    assert 0.2 < len(carrying) / len(a) < 0.4                      # share 0.3 of 200 requests
    assert {len(p.images) for p in carrying} == {1, 2}
    urls = [i.url for p in carrying for i in p.images]
    assert len(set(urls)) == len(urls)                             # no image repeats: no cache hit to measure
    assert all(uri_size(i.url)[:2] == (i.width, i.height) for p in carrying for i in p.images)
    assert parse_workload(w.params()).params() == w.params() and parse_workload(str(w)).params() == w.params()
    assert parse_workload("image:input_len=8,output_len=4,share=0").max_images == 0


@pytest.mark.parametrize("bad", ["image:input_len=8,output_len=4,share=1.5", "image:input_len=8,output_len=4,images=0",
                                 "image:input_len=8,output_len=4,images=3-1", "image:input_len=8,output_len=4,sizes=12",
                                 "image:input_len=8,output_len=4,format=gif", "image:input_len=8,output_len=4,colour=1"])
def test_image_workload_rejects_bad_keys_in_one_line(bad: str) -> None:
    with pytest.raises(UserError) as e:
        parse_workload(bad)
    assert "\n" not in str(e.value)


def test_chat_messages_put_images_ahead_of_their_messages_text() -> None:
    img = ImageRef(8, 8, "png", "data:image/png;base64,AAAA")
    msgs = chat_messages(Prompt("describe", 4, images=(img, img)))
    assert msgs == [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img.url}}] * 2
                     + [{"type": "text", "text": "describe"}]}]
    convo = (dict(role="system", content="s"), dict(role="user", content="a"), dict(role="assistant", content="b"),
             dict(role="user", content="c"))
    placed = chat_messages(Prompt("", 4, messages=convo, images=(ImageRef(8, 8, "png", "u1", message=1),
                                                                 ImageRef(8, 8, "png", "u2"))))
    assert [p["image_url"]["url"] for p in placed[1]["content"][:1]] == ["u1"]
    assert placed[3]["content"][0]["image_url"]["url"] == "u2" and placed[0]["content"] == "s"
    with pytest.raises(UserError, match="chat endpoint"):
        StreamClient("http://x", "m").payload(Prompt("t", 4, images=(img,)))


def test_slo_grammar_bounds_a_class() -> None:
    slo = SLO.parse("ttft[image]:p99<=2s,ttft[text]=1s,tpot:p50<=50ms")
    assert slo.keys == ["slo:ttft[image]:p99", "slo:ttft[text]:p99", "slo:tpot:p50"]
    assert [t.metric_key for t in slo.terms] == ["image_p99_ttft_ms", "text_p99_ttft_ms", "median_tpot_ms"]
    assert str(slo) == "ttft[image]:p99<=2000ms,ttft[text]:p99<=1000ms,tpot:p50<=50ms"
    assert SLO.parse(str(slo)) == slo
    # goodput: a request answers to its own class's terms
    assert slo.request_ok(1500.0, 10.0, 3000.0, images=1) and not slo.request_ok(1500.0, 10.0, 3000.0, images=0)


@pytest.mark.parametrize("bad", ["ttft[img]:p99<=2s", "ttft[]=1s", "ttft[image=2s", "ttft[image]:p99<=2s,ttft[image]=3s"])
def test_bad_class_terms_are_one_line_errors(bad: str) -> None:
    with pytest.raises(SLOError) as e:
        SLO.parse(bad)
    assert "\n" not in str(e.value)


def test_class_terms_need_a_workload_with_that_class() -> None:
    text_only = parse_workload("random:input_len=8,output_len=4")
    all_images = parse_workload("image:input_len=8,output_len=4")
    with pytest.raises(SLOError, match="sends no images"):
        check_slo_classes(SLO.parse("ttft[image]=2s"), text_only)
    with pytest.raises(SLOError, match="share 1"):
        check_slo_classes(SLO.parse("ttft[text]=2s"), all_images)
    check_slo_classes(SLO.parse("ttft[image]=2s,ttft[text]=1s"), parse_workload("image:input_len=8,output_len=4,share=0.5"))


def _rec(ttft: float, images: int, ok: bool = True, start: float = 0.0) -> RequestRecord:
    return RequestRecord(start_s=start, ttft_ms=ttft if ok else None, e2el_ms=ttft + 90.0 if ok else None,
                         itl_ms=[10.0] * 9 if ok else [], input_tokens=100 + 300 * images, output_tokens=10 if ok else 0,
                         ok=ok, images=images)


def test_figures_per_class_and_images_per_second() -> None:
    records = [_rec(100.0 + i, 0) for i in range(10)] + [_rec(900.0 + i, 2) for i in range(5)] + [_rec(0, 1, ok=False)]
    x = summarize(records, 10.0, SLO.parse("ttft[image]:p99<=1s,ttft[text]:p99<=200ms"))
    assert x["text_completed"] == 10 and x["image_completed"] == 5 and x["image_failed"] == 1
    assert x["total_images"] == 10 and x["images_per_s"] == pytest.approx(1.0)   # failed requests' images not counted
    assert x["text_median_ttft_ms"] == pytest.approx(104.5) and x["image_median_ttft_ms"] == pytest.approx(902.0)
    assert x["image_mean_input_tokens"] == pytest.approx(700.0) and x["text_mean_input_tokens"] == 100.0
    assert x["goodput"] == pytest.approx(1.5)           # the 15 that completed met their class's limit
    margins = slo_margins(records, SLO.parse("ttft[image]:p50<=1s,ttft[text]:p99<=200ms"))
    assert margins["slo:ttft[text]:p99"] < 0
    assert margins["slo:ttft[image]:p50"] < 0           # 1 failed of 6 image requests: the median still holds
    assert slo_margins(records, SLO.parse("ttft[image]:p90<=1s"))["slo:ttft[image]:p90"] > 0   # but not the p90
    text_only = summarize([_rec(100.0, 0)], 1.0)
    assert not any(k.startswith(("image_", "text_")) or k == "images_per_s" for k in text_only)


def test_early_abort_judges_a_class_term_on_its_class_alone() -> None:
    from autotune.bench.abort import EarlyAbort
    from autotune.bench.client import Live

    slo = SLO.parse("ttft[image]:p99<=1s")
    slow_text = [_rec(5000.0, 0) for _ in range(40)]
    assert EarlyAbort(slo, 100).check(slow_text, [], 0.0) is None            # text requests are not its class
    slow_images = [_rec(5000.0, 1) for _ in range(25)]
    assert EarlyAbort(slo, 100).check(slow_images, [], 0.0).startswith("ttft[image]:p99<=1000ms: 25 of 25")
    waiting = [Live(0.0, images=1) for _ in range(30)]                       # in flight past the limit, no token
    assert EarlyAbort(SLO.parse("ttft=1s"), 40).check([], waiting, 2.0) is not None
    assert EarlyAbort(slo, 40).check([], waiting, 2.0) is None     # a class's total is unknown: no 'certain' rule


def test_a_class_with_no_request_in_a_run_is_not_held_against_it() -> None:
    slo = SLO.parse("ttft[image]:p99<=1s,ttft[text]:p99<=200ms")
    texts = [_rec(100.0, 0) for _ in range(4)]
    assert slo_margins(texts, slo) == {"slo:ttft[text]:p99": pytest.approx(-100.0)}     # image term: nothing to judge
    mixed = summarize(texts + [_rec(50.0, 1)], 1.0)
    assert slo.margins({k: v for k, v in mixed.items() if not k.startswith("image_")})["slo:ttft[image]:p99"] == 0.0
    failed = summarize(texts + [_rec(0, 1, ok=False)], 1.0)
    assert slo.margins(failed)["slo:ttft[image]:p99"] == float("inf")     # all of the class failed: broken
