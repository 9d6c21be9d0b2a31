"""The warm start's parts around the twin: which cores its workers may take (none that a running trial's
lease holds on this host), and the cache that lets a second study with the same key skip the ranking."""

from __future__ import annotations

from pathlib import Path

from autotune.slo import SLO
from autotune.space import SearchSpace
from autotune.store.repository import ResultStore
from autotune.tuner.twin_cache import RankingCache, cache_key
from autotune.tuner.twin_pool import TwinJob, spare_cores

SPACE = SearchSpace.from_mapping({"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 256, "log": True}}}, "t")


def _job(**changes: object) -> TwinJob:
    fields: dict[str, object] = dict(model="llama-3.1-8b", gpu="H200", num_gpus=1, fixed_flags=("--max-model-len", "8192"),
                                     space=SPACE, workload={"kind": "random", "input_len": 4096, "output_len": 256},
                                     slo=SLO.parse("ttft=1s"), requests=96)
    fields.update(changes)
    return TwinJob(**fields)  # type: ignore[arg-type]


def test_the_cores_of_this_hosts_running_leases_are_not_spare(tmp_path: Path) -> None:
    store = ResultStore(f"sqlite:///{tmp_path}/s.db")
    study = store.ensure_study(name="s", model="m", engine_kind="sim", engine_command=[], fixed_flags=[],
                               space_hash="x", spec_hash="x", spec={}, objectives=[], slo="ttft=1s", quality_knobs=[])
    common = dict(params={}, flags=[], spec_hash="x", optuna_trial_id=0)
    store.save_trial(study.id, 0, state="running", host="h1", lease={"cores": [0, 1, 2]}, **common)
    store.save_trial(study.id, 1, state="ok", host="h1", lease={"cores": [3]}, **common)          # finished
    store.save_trial(study.id, 2, state="running", host="h2", lease={"cores": [4]}, **common)     # another host
    store.save_trial(study.id, 3, state="running", host="h1", lease=None, **common)               # not yet leased
    assert store.held_cores("h1") == {0, 1, 2}
    assert spare_cores(store.held_cores("h1"), host_cores=range(8)) == [3, 4, 5, 6, 7]
    assert spare_cores({0, 1}, host_cores=[0, 1]) == []


def test_a_second_study_with_the_same_key_reads_the_first_ones_predictions(tmp_path: Path) -> None:
    first = RankingCache(tmp_path, _job())
    first.save({first.key({"max_num_seqs": 16}): {"capacity_tps": 900.0}, first.key({"max_num_seqs": 9}): None})
    second = RankingCache(tmp_path, _job())
    assert second.path == first.path
    assert second.load() == {second.key({"max_num_seqs": 16}): {"capacity_tps": 900.0},
                             second.key({"max_num_seqs": 9}): None}
    second.save({second.key({"max_num_seqs": 32}): {"capacity_tps": 1200.0}})      # merged, not replaced
    assert len(RankingCache(tmp_path, _job()).load()) == 3


def test_what_a_prediction_depends_on_keys_the_cache() -> None:
    base = cache_key(_job())
    other_space = SearchSpace.from_mapping({"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 512}}}, "t")
    for change in (dict(model="llama-3.1-70b"), dict(gpu="H100"), dict(num_gpus=2), dict(space=other_space),
                   dict(workload={"kind": "random", "input_len": 1024, "output_len": 256}),
                   dict(slo=SLO.parse("ttft=2s")), dict(fixed_flags=()), dict(requests=48)):
        assert cache_key(_job(**change)) != base, change
    assert cache_key(_job()) == base


def test_an_unreadable_cache_is_an_empty_one(tmp_path: Path) -> None:
    cache = RankingCache(tmp_path, _job())
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text("{not json")
    assert cache.load() == {}


def test_the_twins_own_code_keys_the_cache(tmp_path: Path, monkeypatch) -> None:
    """A fixed twin never reads an older twin's predictions: the key hashes the twin's source files. Here a
    copy of them with one line changed stands in for the package."""
    import shutil

    from autotune.tuner import twin_cache

    assert twin_cache.twin_fingerprint() == twin_cache.twin_fingerprint()
    files = [f for p in twin_cache.TWIN_SOURCES for f in twin_cache.PACKAGE.glob(p)]
    assert any(f.name == "capacity.py" for f in files) and any(f.parent.name == "perfmodel" for f in files)
    base = cache_key(_job())
    copy = tmp_path / "autotune"
    for f in files:
        (copy / f.relative_to(twin_cache.PACKAGE)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, copy / f.relative_to(twin_cache.PACKAGE))
    monkeypatch.setattr(twin_cache, "PACKAGE", copy)
    twin_cache.twin_fingerprint.cache_clear()
    try:
        assert cache_key(_job()) == base                     # the same code, the same key
        with open(copy / "sim" / "capacity.py", "a") as f:
            f.write("\n# a change to the twin\n")
        twin_cache.twin_fingerprint.cache_clear()
        assert cache_key(_job()) != base
    finally:
        twin_cache.twin_fingerprint.cache_clear()
