"""The confirmation's capacity verdict read two ways, on the GPU studies' stored rounds.

`capacity_tps` is the throughput at the highest load that met the SLO. A server whose throughput falls as
streams are added (vLLM's defaults on the H100 decode study: 12,318 tok/s at 128 streams, 10,649 at 216,
both within the SLO) is read at its lower figure, though a user could run it at the better load. This
reads every repeat a second way, the best steady throughput over all its SLO-meeting steps, and gives the
paired verdict against the baseline both ways (the study's own spread rule), so a reader can see whether
a verdict rests on which reading is used.

    python3 benchmarks/gpu/best_met_step.py DB...     # sqlite files (gunzip the .db.gz first)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.errors import UserError                                  # noqa: E402
from autotune.report.confirmed import met_steps                         # noqa: E402
from autotune.store.models import ConfirmationRecord                   # noqa: E402
from autotune.store.repository import ResultStore                      # noqa: E402
from autotune.tuner.verdict import objective_verdict, spread_rule      # noqa: E402

OBJECTIVE = "capacity_tps"


def best_met(row: ConfirmationRecord) -> float | None:
    """The best steady throughput over the repeat's steps that met the SLO (None: no step met it)."""
    return max((tps for _, tps in met_steps(row.capacity)), default=None)


def verdicts(path: str) -> list[str]:
    """One line per candidate and reading, for every study in one DB whose objectives hold capacity_tps."""
    store = ResultStore(f"sqlite:///{path}", create=False)
    lines = []
    for name in store.study_names():
        study = store.study(name)
        trials = {t.id: t for t in store.trials(study.id)}
        base = next((t for t in trials.values() if t.role == "baseline"), None)
        rows = [r for r in store.confirmations(study.id) if r.state == "ok" and OBJECTIVE in r.objectives]
        if base is None or not rows:
            continue
        readings = {"highest met load": lambda r: r.objectives[OBJECTIVE], "best met step": best_met}
        for tid in sorted({r.trial_id for r in rows} - {base.id}, key=lambda i: trials[i].number):
            for label, read in readings.items():
                base_by = {r.round: read(r) for r in rows if r.trial_id == base.id}
                mine = {r.round: read(r) for r in rows if r.trial_id == tid}
                pairs = [(base_by[k], v) for k, v in mine.items() if k in base_by and base_by[k] and v]
                v = objective_verdict(OBJECTIVE, "maximize", pairs, [x for x in base_by.values() if x],
                                      [x for x in mine.values() if x], spread_rule(study))
                lines.append(f"{name} #{trials[tid].number} ({label}): {v.text()}")
    return lines


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        for path in paths:
            print("\n".join(verdicts(path)))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
