"""`autotune convert` with images (issue 25): each request's image count, sizes and place survive the
conversion; `--lengths-only` keeps no image byte (a planted marker image is found nowhere in the
trace), and the replay makes synthetic images of the recorded sizes."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

from autotune.bench.images import data_uri, make_image, uri_size
from autotune.bench.trace.command import main as convert
from autotune.bench.trace.format import UNKNOWN_SIZE, read_trace
from autotune.bench.workloads import parse_workload

MARKER = "WOMBAT-PIXELS-9031"


def marker_png(width: int, height: int) -> bytes:
    """A real PNG of the size, with the marker in a text chunk (so it is in the bytes, not only the pixels)."""
    png = make_image(width, height, seed=4242)
    text = b"Comment\x00" + MARKER.encode()
    chunk = struct.pack(">I", len(text)) + b"tEXt" + text + struct.pack(">I", zlib.crc32(b"tEXt" + text) & 0xFFFFFFFF)
    return png[:-12] + chunk + png[-12:]       # before IEND


def image_log(path: Path, uri: str) -> Path:
    """A gateway log: a text request, a request with the marker image and a linked image, and the next
    turn of that conversation (which sends the image again, as chat clients do)."""
    first = [{"role": "user", "content": [{"type": "text", "text": "what is in this picture"},
                                          {"type": "image_url", "image_url": {"url": uri}},
                                          {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}]}]
    second = first + [{"role": "assistant", "content": "a wombat"},
                      {"role": "user", "content": "and its colour"}]
    lines = [{"timestamp": 100.0, "request": {"messages": [{"role": "user", "content": "plain text only"}]},
              "response": {"usage": {"prompt_tokens": 4, "completion_tokens": 6}}},
             {"timestamp": 101.0, "request": {"messages": first}, "duration_ms": 500,
              "response": {"usage": {"prompt_tokens": 700, "completion_tokens": 9}}},
             {"timestamp": 103.0, "request": {"messages": second},
              "response": {"usage": {"prompt_tokens": 720, "completion_tokens": 5}}}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_lengths_only_keeps_image_counts_and_sizes_and_no_image_byte(tmp_path: Path) -> None:
    data = marker_png(320, 200)
    uri = data_uri(data, "png")
    log = image_log(tmp_path / "log.jsonl", uri)
    private, kept = tmp_path / "private.jsonl", tmp_path / "kept.jsonl"
    assert convert([str(log), "-o", str(private), "--lengths-only"]) == 0
    assert convert([str(log), "-o", str(kept)]) == 0
    raw = private.read_text()
    payload = uri.split(",", 1)[1]
    assert MARKER not in raw and payload[:64] not in raw and "data:image" not in raw
    assert MARKER in base64.b64decode(payload).decode("latin-1")    # planted: the source image's bytes hold it
    assert payload in kept.read_text()          # without --lengths-only the recorded image is kept: the check bites
    _, recs = read_trace(private)
    assert [len(r.images or ()) for r in recs] == [0, 2, 2]
    assert recs[1].images == [{"width": 320, "height": 200, "format": "png", "message": 0},
                              {"width": None, "height": None, "format": "png", "message": 0}]
    assert recs[2].images == recs[1].images and recs[2].turn == 1 and recs[2].conversation == recs[1].conversation
    assert recs[1].input_tokens == 700          # the log's own count (it holds the image tokens)


def test_replay_of_a_lengths_only_trace_makes_images_of_the_recorded_sizes(tmp_path: Path) -> None:
    uri = data_uri(marker_png(320, 200), "png")
    private = tmp_path / "private.jsonl"
    assert convert([str(image_log(tmp_path / "log.jsonl", uri)), "-o", str(private), "--lengths-only"]) == 0
    w = parse_workload({"kind": "trace", "path": str(private)})
    assert w.max_images == 2 and set(w.image_sizes) == {(320, 200), UNKNOWN_SIZE}
    prompts = w.one_pass(None)
    made = prompts[1].images
    assert [(i.width, i.height) for i in made] == [(320, 200), UNKNOWN_SIZE]
    assert all(uri_size(i.url)[:2] == (i.width, i.height) and i.url != uri for i in made)
    assert made[0].message == 0 and not prompts[0].images
    kept = tmp_path / "kept.jsonl"
    assert convert([str(image_log(tmp_path / "log2.jsonl", uri)), "-o", str(kept)]) == 0
    assert parse_workload({"kind": "trace", "path": str(kept)}).one_pass(None)[1].images[0].url == uri


def test_sharegpt_llava_records_place_their_image_files(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "cat.png").write_bytes(make_image(640, 480, seed=1))
    records = [{"id": "a", "image": "imgs/cat.png", "conversations": [
                   {"from": "human", "value": "<image>\nWhat animal is this?"}, {"from": "gpt", "value": "A cat."},
                   {"from": "human", "value": "Is it asleep?"}, {"from": "gpt", "value": "No, it is awake."}]},
               {"id": "b", "images": ["imgs/gone.jpg"], "conversations": [
                   {"from": "human", "value": "Describe <image> briefly"}, {"from": "gpt", "value": "A street."}]},
               {"id": "c", "conversations": [{"from": "human", "value": "no picture here"},
                                             {"from": "gpt", "value": "fine"}]}]
    src = tmp_path / "llava.json"
    src.write_text(json.dumps(records))
    out = tmp_path / "t.jsonl"
    assert convert([str(src), "-o", str(out), "--lengths-only"]) == 0
    _, recs = read_trace(out)
    by_conv: dict[str, list] = {}
    for r in recs:
        by_conv.setdefault(r.conversation or r.messages[0]["content"], []).append(r)
    cat = next(v for v in by_conv.values() if len(v) == 2)
    assert [r.images for r in cat] == [[{"width": 640, "height": 480, "format": "png", "message": 0}]] * 2
    assert all("<image>" not in m["content"] for r in recs for m in r.messages)
    gone = next(r for r in recs if r.images and r.images[0]["width"] is None)
    assert gone.images == [{"width": None, "height": None, "format": "png", "message": 0}]
    assert sum(1 for r in recs if not r.images) == 1
