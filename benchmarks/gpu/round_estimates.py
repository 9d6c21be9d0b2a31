"""How well the confirmation's plan foresaw each round's length, on the GPU studies' stored rounds.

A round is started only when the time left holds all of it (tuner/confirm.run_round), and its length
is foreseen as the sum of `expected_repeat_s` over its repeats: each configuration's longest repeat
stored so far, else its first run's wall. An estimate too high refuses rounds that would have fitted
(scarce device time goes unused); one too low lets a round start that the deadline then cuts (its
pairs are lost). This replays the plan for every stored round with only the rows stored before that
round began, and prints the estimate beside the round's actual length (the sum of its repeats' walls).

    python3 benchmarks/gpu/round_estimates.py DB...     # sqlite files (gunzip the .db.gz first)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.errors import UserError                   # noqa: E402
from autotune.store.queries import wall_s               # noqa: E402
from autotune.store.repository import ResultStore       # noqa: E402
from autotune.tuner.confirm import expected_repeat_s    # noqa: E402


def replay(path: str) -> list[tuple[str, int, int, float, float]]:
    """(study, round, repeats, estimate s, actual s) for every round of every study in one DB, in the
    order the rounds began."""
    store = ResultStore(f"sqlite:///{path}", create=False)
    out = []
    for name in store.study_names():
        study = store.study(name)
        trials = {t.id: t for t in store.trials(study.id)}
        rows = [r for r in store.confirmations(study.id) if r.started_at is not None]
        rounds: dict[int, list] = {}
        for r in rows:
            rounds.setdefault(r.round, []).append(r)
        for number, reps in sorted(rounds.items(), key=lambda kv: min(r.started_at for r in kv[1])):
            begun = min(r.started_at for r in reps)
            before = [r for r in rows if r.finished_at is not None and r.finished_at <= begun]
            estimate = sum(expected_repeat_s(trials[r.trial_id], before, 0.0) for r in reps)
            actual = sum(wall_s(r) or 0.0 for r in reps)
            out.append((name, number, len(reps), estimate, actual))
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    ratios = []
    try:
        replays = [replay(path) for path in paths]
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'study':34} {'round':>5} {'repeats':>7} {'estimate s':>10} {'actual s':>9} {'est/actual':>10}")
    for rounds in replays:
        for name, number, n, est, act in rounds:
            ratio = est / act if act else float("nan")
            ratios.append(ratio)
            print(f"{name:34} {number + 1:>5} {n:>7} {est:>10.0f} {act:>9.0f} {ratio:>10.2f}")
    if ratios:
        below = sum(1 for x in ratios if x < 1.0)
        print(f"{len(ratios)} rounds: estimate / actual median {statistics.median(ratios):.2f}, "
              f"{min(ratios):.2f}-{max(ratios):.2f}; below the actual in {below}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
