"""The twin's predictions kept on disk, so that a second study of the same model, GPU, workload and space
ranks at once instead of spending minutes of CPU beside its baseline's start.

One JSON file per key in `twin-rankings/` beside the study's log folder (the SQLite file's folder for a
`run`, LOG_DIR/HOST for the daemon): the key hashes everything a prediction depends on (the model, the
GPU and how many, the fixed flags, the search space's fingerprint, the workload, the SLO, the requests a
simulated step sends, and the twin's own code: TWIN_SOURCES hashed, so that a fixed twin never serves an
older one's predictions; two faults fixed on 2026-12-06 each moved the H100 decode study's figures by
x2), and the file maps each candidate's rendered flags to the twin's prediction (null:
it cannot start). Candidates are drawn with the study's seed, so a
study with the same seed and count finds every prediction here; another seed finds those it shares.
Writes go to a temporary file and are renamed over the old one, merged with what is there, so studies
writing at once lose nothing worse than each other's latest additions. The twin is simulated: the
cache only saves its CPU time, the numbers are the same.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from autotune.tuner.dedupe import flags_key
from autotune.tuner.twin_pool import TwinJob

FOLDER = "twin-rankings"
PACKAGE = Path(__file__).resolve().parents[1]
# what the twin's predictions are computed by (tuner/warmstart.twin_predictor and what it calls)
TWIN_SOURCES = ("perfmodel/*.py", "sim/capacity.py", "sim/inprocess.py", "sim/scheduler.py", "tuner/warmstart.py",
                "bench/metrics.py", "slo.py")


class RankingCache:
    def __init__(self, root: Path, job: TwinJob) -> None:
        self.job = job
        self.path = Path(root) / FOLDER / f"{cache_key(job)}.json"

    def key(self, params: dict[str, Any]) -> str:
        return flags_key(self.job.space.render(params))

    def load(self) -> dict[str, Any]:
        """Flags key -> prediction (None: cannot start); empty when there is no file or it is unreadable."""
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return dict(doc.get("predictions", {})) if isinstance(doc, dict) else {}

    def save(self, predictions: dict[str, Any]) -> None:
        """Merge `predictions` into the file (atomically); a folder that cannot be written is skipped:
        the cache only saves time."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**self.load(), **predictions}
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"simulated": True, "key": describe(self.job), "predictions": merged}))
            os.replace(tmp, self.path)
        except OSError:
            pass


def describe(job: TwinJob) -> dict[str, Any]:
    """What the predictions depend on, as stored beside them (and hashed into the file's name)."""
    return {"model": job.model, "gpu": job.gpu, "num_gpus": job.num_gpus, "fixed_flags": list(job.fixed_flags),
            "space": job.space.fingerprint(), "workload": dict(job.workload), "slo": str(job.slo),
            "requests": job.requests, "twin": twin_fingerprint()}


@lru_cache(maxsize=1)
def twin_fingerprint() -> str:
    """A hash of the twin's source files (TWIN_SOURCES, under the installed package): any change to the
    code that computes a prediction starts a new cache file; the old one is left where it is."""
    h = hashlib.sha256()
    for pattern in TWIN_SOURCES:
        for f in sorted(PACKAGE.glob(pattern)):
            h.update(f.relative_to(PACKAGE).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def cache_key(job: TwinJob) -> str:
    return hashlib.sha256(json.dumps(describe(job), sort_keys=True, default=str).encode()).hexdigest()[:16]
