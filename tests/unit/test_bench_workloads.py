"""Workload parsing and generation: lengths, seeding, prefixes, files, errors."""

import json

import pytest

from autotune.bench.workloads import JsonlWorkload, PrefixWorkload, RandomWorkload, parse_workload
from autotune.bench.workloads.sample import SAMPLE_PATH, sample_records
from autotune.errors import UserError


class CharTokenizer:
    """One token per character: exact and predictable, so lengths can be asserted."""
    vocab_size = 26

    def encode(self, text):
        return [26 if c == "\n" else ord(c) - 97 for c in text if "a" <= c <= "z" or c == "\n"]

    def decode(self, ids):
        return "".join("\n" if i == 26 else chr(97 + i) for i in ids)


def test_parse_text_and_mapping_agree():
    a = parse_workload("random:input_len=300,output_len=40,range_ratio=0.2")
    b = parse_workload({"kind": "random", "input_len": 300, "output_len": 40, "range_ratio": 0.2})
    assert isinstance(a, RandomWorkload) and a.params() == b.params()
    assert parse_workload(a.params()).params() == a.params()           # round trip
    assert str(a) == "random:input_len=300,output_len=40,range_ratio=0.2"


@pytest.mark.parametrize("spec, words", [
    ("random:input_len=300", "missing output_len"),
    ("random:input_len=3x,output_len=4", "not an integer"),
    ("random:input_len=0,output_len=4", ">= 1"),
    ("random:input_len=3,output_len=4,range_ratio=1.5", "range_ratio"),
    ("random:input_len=3,output_len=4,colour=red", "unknown key 'colour'"),
    ("zipf:a=1", "unknown"),
    ("random:input_len", "not key=value"),
    ("jsonl:path=/nonexistent/file.jsonl", "cannot read"),
])
def test_bad_specs_are_user_errors(spec, words):
    with pytest.raises(UserError, match=words):
        parse_workload(spec)


def test_random_exact_lengths_with_tokenizer_and_seeded():
    tok = CharTokenizer()
    w = RandomWorkload(50, 7)
    ps = w.prompts(20, seed=1, tokenizer=tok)
    assert all(p.input_tokens == 50 and len(tok.encode(p.text)) == 50 and p.output_len == 7 for p in ps)
    assert [p.text for p in ps] == [p.text for p in w.prompts(20, seed=1, tokenizer=tok)]
    assert ps[0].text != w.prompts(1, seed=2, tokenizer=tok)[0].text


def test_random_range_ratio_spreads_lengths_within_bounds():
    ps = RandomWorkload(100, 40, range_ratio=0.2).prompts(500, seed=0, tokenizer=CharTokenizer())
    ins, outs = [p.input_tokens for p in ps], [p.output_len for p in ps]
    assert min(ins) >= 80 and max(ins) <= 120 and len(set(ins)) > 20
    assert min(outs) >= 32 and max(outs) <= 48
    assert abs(sum(ins) / len(ins) - 100) < 3


def test_random_without_tokenizer_uses_words_and_leaves_count_to_server():
    p = RandomWorkload(30, 5).prompts(1)[0]
    assert len(p.text.split()) == 30 and p.input_tokens is None


def test_prefix_shares_exactly_the_prefix():
    tok = CharTokenizer()
    ps = PrefixWorkload(prefix_len=40, suffix_len=10, output_len=5).prompts(5, seed=0, tokenizer=tok)
    heads = {p.text.split("\n")[0] for p in ps}
    tails = {p.text.split("\n")[1] for p in ps}
    assert len(heads) == 1 and len(tails) == 5
    assert all(p.input_tokens == 50 for p in ps)


def test_jsonl_reads_sharegpt_and_plain_lines(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"conversations": [{"from": "human", "value": "abc"},
                                               {"from": "gpt", "value": "defgh"}]}) + "\n"
                 + json.dumps({"prompt": "xyz", "output_len": 9}) + "\n"
                 + json.dumps({"conversations": [{"from": "human", "value": "only one turn"}]}) + "\n")
    w = parse_workload(f"jsonl:path={f}")
    ps = w.prompts(4, seed=0, tokenizer=CharTokenizer())
    by_text = {p.text: p for p in ps}
    assert set(by_text) == {"abc", "xyz"}                        # the one-turn record is skipped
    assert by_text["abc"].output_len == 5 and by_text["xyz"].output_len == 9
    assert parse_workload({"kind": "jsonl", "path": str(f), "output_len": 3}).prompts(1)[0].output_len == 3


def test_jsonl_rejects_a_file_without_prompts(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"nothing": 1}\n')
    with pytest.raises(UserError, match="no usable prompt"):
        JsonlWorkload(str(f))
    f.write_text("not json\n")
    with pytest.raises(UserError, match="not JSON lines"):
        JsonlWorkload(str(f))


def test_shipped_sample_is_what_the_generator_makes():
    lines = SAMPLE_PATH.read_text().splitlines()
    assert [json.loads(x) for x in lines] == sample_records()
    ps = parse_workload({"kind": "jsonl", "path": str(SAMPLE_PATH)}).prompts(64)
    assert len({p.text for p in ps}) > 50 and all(p.output_len >= 1 for p in ps)
