"""The GPU pool: --gpus parsing, disjoint leases, exclusive leases, core shares, NUMA from /sys."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.node.pool import GpuPool, numa_cores, parse_cpulist, parse_gpus, split_cores
from autotune.errors import UserError


@pytest.mark.parametrize("text,expected", [("0", [0]), ("0,1,3", [0, 1, 3]), ("0-7", list(range(8))),
                                           ("0-2, 5", [0, 1, 2, 5]), (" 4 - 5 ", [4, 5])])
def test_gpus_accept_lists_and_ranges(text: str, expected: list[int]) -> None:
    assert parse_gpus(text) == expected


@pytest.mark.parametrize("text,words", [("a", "give device indices"), ("0,,1", "give device indices"),
                                        ("3-1", "runs backwards"), ("0-2,1", "repeats"), ("", "give device")])
def test_bad_gpus_are_one_line_errors(text: str, words: str) -> None:
    with pytest.raises(UserError) as e:
        parse_gpus(text)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_leases_are_disjoint_and_come_back() -> None:
    pool = GpuPool(list(range(8)), physical=True, cores=range(16), host="h")
    a, b, c = pool.try_lease(4), pool.try_lease(2), pool.try_lease(2)
    assert a and b and c
    assert a.gpus == (0, 1, 2, 3) and b.gpus == (4, 5) and c.gpus == (6, 7)
    assert not set(a.cores) & set(b.cores) and not set(b.cores) & set(c.cores)
    assert len({a.port_base, b.port_base, c.port_base}) == 3
    assert all(abs(x.port_base - y.port_base) >= 8 for x in (a, b, c) for y in (a, b, c) if x is not y)
    assert pool.try_lease(1) is None and pool.free() == ()
    pool.release(b)
    assert pool.free() == (4, 5)
    assert pool.try_lease(3) is None
    d = pool.try_lease(2)
    assert d is not None and d.gpus == (4, 5) and d.to_json()["port"] == d.port_base


def test_exclusive_needs_the_whole_pool_and_blocks_everything() -> None:
    pool = GpuPool([0, 1, 2, 3], physical=True, cores=range(8), host="h")
    small = pool.try_lease(1)
    assert small is not None and pool.try_lease(1, exclusive=True) is None
    pool.release(small)
    ex = pool.try_lease(1, exclusive=True)
    assert ex is not None and ex.slots == (0, 1, 2, 3) and ex.exclusive and ex.cores == tuple(range(8))
    assert pool.try_lease(1) is None
    pool.release(ex)
    assert pool.free() == (0, 1, 2, 3)


def test_virtual_slots_set_no_devices_and_share_few_cores() -> None:
    pool = GpuPool([0, 1, 2, 3], physical=False, cores=[0, 1], host="h")
    leases = [pool.try_lease(1) for _ in range(4)]
    assert all(x is not None and x.gpus == () for x in leases)
    assert [x.cores for x in leases if x] == [(0,), (1,), (0,), (1,)]     # round-robin, never none


def test_cores_split_evenly_without_numa() -> None:
    shares = split_cores([0, 1, 2], list(range(8)))
    assert shares == {0: (0, 1), 1: (2, 3), 2: (4, 5, 6, 7)}


def _fake_sys(root: Path, devices: dict[str, int], nodes: dict[int, str]) -> Path:
    for dev, node in devices.items():
        d = root / "bus/pci/devices" / dev
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    for node, cpus in nodes.items():
        d = root / f"devices/system/node/node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return root


def test_numa_from_a_fake_sys_tree(tmp_path: Path) -> None:
    root = _fake_sys(tmp_path, {"0000:1b:00.0": 0, "0000:3b:00.0": 0, "0000:9a:00.0": 1, "0000:ba:00.0": -1},
                     {0: "0-7,16-23", 1: "8-15,24-31"})
    bus = {0: "00000000:1B:00.0", 1: "00000000:3B:00.0", 2: "00000000:9A:00.0", 3: "00000000:BA:00.0",
           4: "00000000:FF:00.0"}
    local = numa_cores(bus, root)
    assert set(local) == {0, 1, 2}                         # node -1 and a missing device: unknown
    assert local[2] == list(range(8, 16)) + list(range(24, 32))
    pool = GpuPool([0, 1, 2, 3], physical=True, cores=range(32), numa=local, host="h")
    assert set(pool.share[0]) | set(pool.share[1]) == set(range(8)) | set(range(16, 24))
    assert not set(pool.share[0]) & set(pool.share[1])
    assert set(pool.share[2]) <= set(range(8, 16)) | set(range(24, 32))
    pair = pool.try_lease(2)
    assert pair is not None and pair.gpus == (0, 1)        # two GPUs of one node, not 0 and 2
    assert parse_cpulist("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]


def test_a_pair_stays_on_one_node_when_the_first_free_slot_is_alone() -> None:
    local = {0: range(0, 4), 1: range(4, 8), 2: range(4, 8)}
    pool = GpuPool([0, 1, 2], physical=True, cores=range(8), numa=local, host="h")
    pair = pool.try_lease(2)
    assert pair is not None and pair.gpus == (1, 2)
