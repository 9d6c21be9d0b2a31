"""`autotune convert`: each log format (small files made here) to the canonical trace, turns linked,
`--lengths-only` keeping token lengths and prefix sharing and none of the text, `--window`/`--sample`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.bench.tokens import load_tokenizer
from autotune.bench.trace.command import main as convert
from autotune.bench.trace.format import read_trace
from autotune.bench.trace.prefix import shared_prefix_share
from autotune.bench.workloads import parse_workload

MARKER = "QUOKKA-PRIVATE-4417"
SYSTEM = f"You are the {MARKER} helper for the server team. Answer about requests, the cache and tokens."


def openai_log(path: Path, conversations: int = 4, turns: int = 3) -> Path:
    """Chat logs as a gateway writes them: conversations that share a system prompt, each turn extending
    the last; a completion request; ISO timestamps; the marker in prompts, answers and the user field."""
    lines, t = [], 1748772000.0
    for c in range(conversations):
        history = [{"role": "system", "content": SYSTEM}]
        for k in range(turns):
            history = history + [{"role": "user", "content": f"question {c}.{k} on {MARKER}: how do the requests fare"}]
            answer = f"the {MARKER} answer " * (2 + k)
            lines.append({"timestamp": t, "user": f"u-{MARKER}", "request": {"model": "m", "messages": history,
                          "max_tokens": 64}, "response": {"choices": [{"message": {"role": "assistant",
                          "content": answer}}], "usage": {"prompt_tokens": 40 + 10 * k, "completion_tokens": 5 + k}},
                          "duration_ms": 250})
            history = history + [{"role": "assistant", "content": answer}]
            t += 1.0
        t -= turns - 0.3
    lines.append({"time": "2025-06-01T10:00:09Z", "body": {"prompt": f"complete {MARKER}", "max_tokens": 7}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _convert(*args: str) -> int:
    return convert([str(a) for a in args])


def test_openai_log_links_turns_with_think_time_and_counts(tmp_path: Path, demo_model_dir: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert _convert(openai_log(tmp_path / "log.jsonl"), "-o", out, "--tokenizer", demo_model_dir) == 0
    header, recs = read_trace(out)
    assert header["source"] == "openai" and recs[0].t == 0.0 and len(recs) == 13
    chats = [r for r in recs if r.messages]
    assert len({r.conversation for r in chats}) == 4 and sorted(r.turn for r in chats) == [0] * 4 + [1] * 4 + [2] * 4
    for r in chats:
        if r.turn:   # the next turn came 1 s after the last one started, whose answer took 0.25 s
            assert r.think_s == pytest.approx(0.75)
    assert [r.output_tokens for r in chats if r.conversation == "c0"] == [5, 6, 7]     # the response's usage
    completion = next(r for r in recs if r.prompt is not None)
    assert completion.output_tokens == 7 and completion.conversation is None          # max_tokens fallback
    tok = load_tokenizer(str(demo_model_dir))
    assert completion.input_tokens == len(tok.encode(completion.prompt))
    assert MARKER in out.read_text()            # the marker is really planted: --lengths-only must remove it


def test_lengths_only_keeps_lengths_and_sharing_and_drops_the_text(tmp_path: Path, demo_model_dir: Path) -> None:
    log = openai_log(tmp_path / "log.jsonl")
    plain, private = tmp_path / "plain.jsonl", tmp_path / "private.jsonl"
    assert _convert(log, "-o", plain, "--tokenizer", demo_model_dir) == 0
    assert _convert(log, "-o", private, "--tokenizer", demo_model_dir, "--lengths-only") == 0
    text = private.read_text()
    assert MARKER not in text and "QUOKKA" not in text and "question" not in text and "u-" not in text
    tok = load_tokenizer(str(demo_model_dir))
    (_, a), (header, b) = read_trace(plain), read_trace(private)
    assert header["lengths_only"] is True
    for x, y in zip(a, b):
        assert (x.t, x.output_tokens, x.input_tokens, x.conversation, x.turn) == \
               (y.t, y.output_tokens, y.input_tokens, y.conversation, y.turn)
        if x.messages:
            assert [m["role"] for m in x.messages] == [m["role"] for m in y.messages]
            assert [len(tok.encode(m["content"])) for m in x.messages] == [len(tok.encode(m["content"])) for m in y.messages]
            assert all(m["content"] != n["content"] for m, n in zip(x.messages, y.messages))
        else:
            assert len(tok.encode(x.prompt)) == len(tok.encode(y.prompt))

    def units(recs):
        return [tok.encode("\n".join(m["content"] for m in r.messages) if r.messages else r.prompt) for r in recs]
    # the shared system prompt and each turn's history are shared exactly as in the original
    assert shared_prefix_share(units(b)) == pytest.approx(shared_prefix_share(units(a)), abs=0.01)
    assert shared_prefix_share(units(b)) > 0.3
    later = [r for r in b if r.conversation == "c1"]
    assert later[1].messages[:2] == later[0].messages[:2] and later[2].messages[:4] == later[1].messages[:4]


def test_sharegpt_becomes_conversations_at_the_given_rate(tmp_path: Path, demo_model_dir: Path) -> None:
    src = tmp_path / "sg.json"
    items = [{"id": str(i), "conversations": [
        {"from": "human", "value": f"hello {i} " * 5}, {"from": "gpt", "value": "fine thanks " * (i + 1)},
        {"from": "human", "value": "and then?"}, {"from": "gpt", "value": "then more"}]} for i in range(40)]
    src.write_text(json.dumps(items))
    out = tmp_path / "t.jsonl"
    assert _convert(src, "-o", out, "--tokenizer", demo_model_dir, "--rate", "4", "--think", "2") == 0
    header, recs = read_trace(out)
    assert header["source"] == "sharegpt" and len(recs) == 80
    firsts = sorted(r.t for r in recs if r.turn == 0)
    assert 39 / firsts[-1] == pytest.approx(4.0, rel=0.4)       # Poisson starts at 4 conversations/s
    seconds = [r for r in recs if r.turn == 1]
    assert all(r.think_s == 2.0 and len(r.messages) == 3 and r.messages[1]["role"] == "assistant" for r in seconds)
    tok = load_tokenizer(str(demo_model_dir))
    assert recs[0].output_tokens == len(tok.encode("fine thanks " * (int(recs[0].conversation[1:]) + 1)))


def test_csv_of_lengths_replays_as_lengths(tmp_path: Path) -> None:
    src = tmp_path / "log.csv"
    src.write_text("ts,prompt_tokens,completion_tokens\n2025-06-01T10:00:00Z,100,20\n"
                   "2025-06-01T10:00:00.5Z,200,30\n2025-06-01T10:00:02Z,50,5\n")
    out = tmp_path / "t.jsonl"
    assert _convert(src, "-o", out) == 0
    _, recs = read_trace(out)
    assert [(r.t, r.input_tokens, r.output_tokens) for r in recs] == [(0.0, 100, 20), (0.5, 200, 30), (2.0, 50, 5)]
    w = parse_workload(f"trace:path={out},time_scale=0.5")
    prompts = w.prompts(4)
    assert [p.at_s for p in prompts] == [0.0, 0.5, 2.0, 3.0]     # the second pass starts one mean gap later
    assert [p.output_len for p in prompts[:3]] == [20, 30, 5] and prompts[0].text


def test_window_and_sample_cut_without_reshaping(tmp_path: Path) -> None:
    src = tmp_path / "log.csv"
    src.write_text("".join(f"{i * 0.5},{10 + i},{1 + i % 7}\n" for i in range(400)))
    win, smp = tmp_path / "w.jsonl", tmp_path / "s.jsonl"
    assert _convert(src, "-o", win, "--window", "50:100") == 0
    _, w = read_trace(win)
    assert len(w) == 100 and w[0].t == 0.0 and w[0].input_tokens == 110 and w[-1].t == pytest.approx(49.5)
    assert _convert(src, "-o", smp, "--sample", "100", "--seed", "3") == 0
    _, s = read_trace(smp)
    assert len(s) == 100 and s == sorted(s, key=lambda r: r.t)
    # drawn uniformly: the kept requests spread over the whole log, at their recorded times
    assert s[-1].t > 150 and all((r.t * 2) % 1 == 0 for r in s)


@pytest.mark.parametrize("args, message", [
    (["--window", "9:3"], "END must be after START"),
    (["--sample", "0"], "--sample must be >= 1"),
    (["--from", "csv"], "no column for"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, args, message) -> None:
    log = openai_log(tmp_path / "log.jsonl")
    assert _convert(log, "-o", tmp_path / "o.jsonl", *args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "o.jsonl").exists()
