"""The sample dataset shipped in autotune/data/bench_sample.jsonl, made here so that it can be checked
and regenerated (`python -m autotune.bench.workloads.sample`). ShareGPT format, synthetic: questions
and answers of spread lengths built from templates, no third-party text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SAMPLE_PATH = Path(__file__).resolve().parents[2] / "data" / "bench_sample.jsonl"

_TOPICS = ["a CPU cache", "a hash table", "TCP slow start", "garbage collection", "a B-tree", "paged attention",
           "speculative decoding", "the KV cache", "continuous batching", "tensor parallelism", "a bloom filter",
           "copy-on-write", "virtual memory", "a mutex", "backpressure", "consistent hashing"]
_ASKS = ["Explain {t} to a new engineer.", "What problem does {t} solve, and what does it cost?",
         "Give three pitfalls of {t} in production.", "Compare {t} with the simplest alternative.",
         "Write a short checklist for debugging {t}."]
_SENTENCES = ["It trades memory for time.", "The common case must stay fast.", "Measure before changing it.",
              "Most failures come from an unchecked assumption.", "The tail latency tells the real story.",
              "Small batches waste the hardware; large ones hurt latency.", "Contention grows with load.",
              "A good default covers most workloads.", "Keep the hot path free of allocation.",
              "Every cache needs an eviction policy."]


def sample_records(n: int = 64, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        topic = _TOPICS[int(rng.integers(len(_TOPICS)))]
        ask = _ASKS[int(rng.integers(len(_ASKS)))].format(t=topic)
        context = " ".join(_SENTENCES[int(j)] for j in rng.integers(0, len(_SENTENCES), int(rng.integers(0, 30))))
        answer = " ".join(_SENTENCES[int(j)] for j in rng.integers(0, len(_SENTENCES), int(rng.integers(2, 25))))
        out.append({"id": f"sample-{i}", "conversations": [
            {"from": "human", "value": (context + "\n\n" + ask).strip()},
            {"from": "gpt", "value": answer}]})
    return out


def write_sample(path: Path = SAMPLE_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in sample_records()), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_sample(Path(sys.argv[1]) if len(sys.argv) > 1 else SAMPLE_PATH))
