"""The node's accelerators as a pool of slots, each with a share of the CPU cores and a block of ports.

A trial leases a disjoint set of slots for its candidate's layout (TP x PP x DP GPUs), the cores of
those slots (NUMA-local to its GPUs where /sys says which node each GPU hangs off), and a block of
ports for the HTTP server and vLLM's internal ones. Co-running trials then share as little as the
host allows. On the CPU build and the simulator the slots are virtual: they bound how many servers run
at once and split the cores, but no CUDA_VISIBLE_DEVICES is set.

    >>> pool = GpuPool([0, 1, 2, 3], physical=True, cores=range(16))
    >>> a = pool.try_lease(2); b = pool.try_lease(2); pool.try_lease(1) is None
    True
    >>> pool.release(a); pool.free()
    (0, 1)
"""

from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from autotune.engine.process import listen_range
from autotune.errors import UserError

PORTS_PER_LEASE = 8          # HTTP port, then vLLM's internal ones (VLLM_PORT, data-parallel RPC, ...)


def host_name() -> str:
    """This host's name as trials and heartbeats record it. AUTOTUNE_HOST overrides it, so that two
    daemons on one machine can stand for two hosts in a test (and a container can carry its node's name)."""
    return os.environ.get("AUTOTUNE_HOST") or socket.gethostname()


@dataclass(frozen=True)
class Lease:
    host: str
    gpus: tuple[int, ...]     # physical indices -> CUDA_VISIBLE_DEVICES (empty on the CPU build/sim)
    slots: tuple[int, ...]    # pool slots held (== gpus on GPU hosts; virtual slots on CPU/sim)
    cores: tuple[int, ...]    # CPU cores for the server and its load client (NUMA-local when known)
    port_base: int            # a block of PORTS_PER_LEASE ports for this trial
    exclusive: bool = False   # nothing else runs on the node while it is held

    @property
    def port(self) -> int:
        """The server's HTTP port (the first of the block)."""
        return self.port_base

    def to_json(self) -> dict[str, Any]:
        """What a trial records about where it ran."""
        out = asdict(self)
        out.update(gpus=list(self.gpus), slots=list(self.slots), cores=list(self.cores), port=self.port_base)
        return out


def parse_gpus(text: str) -> list[int]:
    """`0,1,3`, `0-7` or both (`0-3,6`) -> indices; a one-line UserError otherwise."""
    if not re.fullmatch(r"\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*", text or ""):
        raise UserError(f"--gpus {text!r}: give device indices such as 0, 0,1,3 or 0-7")
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if hi and int(hi.strip()) < int(lo):
            raise UserError(f"--gpus {text!r}: range {part.strip()} runs backwards")
        out.extend(range(int(lo), int(hi.strip() or lo) + 1))
    if len(set(out)) != len(out):
        raise UserError(f"--gpus {text!r}: an index repeats")
    return out


def parse_cpulist(text: str) -> list[int]:
    """The kernel's cpulist format (`0-3,8-11`, `5`, empty) -> core numbers."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def format_cpulist(values: Sequence[int]) -> str:
    """Core numbers -> the kernel's cpulist format: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def numa_cores(bus_ids: Mapping[int, str], sys_root: Path = Path("/sys")) -> dict[int, list[int]]:
    """GPU index -> the cores of the NUMA node its PCI device sits on, for the GPUs /sys knows about.

    NVML's bus id reads `00000000:3B:00.0`; /sys names the device `0000:3b:00.0`. A node of -1 (no
    NUMA information, common in VMs) leaves that GPU out, so the caller falls back to an even split."""
    out: dict[int, list[int]] = {}
    for gpu, bus in bus_ids.items():
        dom, _, rest = bus.lower().partition(":")
        name = f"{dom[-4:]}:{rest}" if rest else bus.lower()
        try:
            node = int((sys_root / "bus/pci/devices" / name / "numa_node").read_text().strip())
            if node < 0:
                continue
            out[gpu] = parse_cpulist((sys_root / f"devices/system/node/node{node}/cpulist").read_text())
        except (OSError, ValueError):
            continue
    return out


def nvml_bus_ids(gpus: Sequence[int]) -> dict[int, str]:
    """GPU index -> PCI bus id from NVML; empty where NVML is absent."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        out = {}
        for i in gpus:
            bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).busId
            out[i] = bus.decode() if isinstance(bus, bytes) else str(bus)
        return out
    except Exception:
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def split_cores(slots: Sequence[int], cores: Sequence[int],
                local: Mapping[int, Sequence[int]] | None = None) -> dict[int, tuple[int, ...]]:
    """Each slot's share of `cores`: the slots on one NUMA node split that node's cores (those in
    `cores`) evenly; slots with no known node split what is left. With fewer cores than slots, slots
    share cores round-robin rather than getting none."""
    allowed = list(dict.fromkeys(cores))
    groups: dict[tuple[int, ...], list[int]] = {}
    for s in slots:
        node = tuple(c for c in (local or {}).get(s, ()) if c in allowed)
        groups.setdefault(node, []).append(s)
    claimed = {c for key in groups if key for c in key}
    rest = [c for c in allowed if c not in claimed] or allowed
    out: dict[int, tuple[int, ...]] = {}
    for key, members in groups.items():
        pool = list(key) or rest
        if len(pool) >= len(members):
            size = len(pool) // len(members)
            for i, s in enumerate(members):
                hi = (i + 1) * size if i < len(members) - 1 else len(pool)
                out[s] = tuple(pool[i * size:hi])
        else:
            for i, s in enumerate(members):
                out[s] = (pool[i % len(pool)],)
    return out


def _port_block_free(base: int, n: int) -> bool:
    for port in range(base, base + n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


class GpuPool:
    """Leases disjoint slot sets. Thread-safe; the scheduler decides who asks first."""

    def __init__(self, slots: Sequence[int], *, physical: bool, cores: Sequence[int] | None = None,
                 numa: Mapping[int, Sequence[int]] | None = None, host: str | None = None) -> None:
        if not slots:
            raise UserError("the GPU pool is empty: give --gpus or --parallel")
        self.slots = tuple(slots)
        self.physical = physical
        self.host = host or host_name()
        self.cores = tuple(sorted(os.sched_getaffinity(0))) if cores is None else tuple(cores)
        self.share = split_cores(self.slots, self.cores, numa)
        self.node = {s: tuple((numa or {}).get(s, ())) for s in self.slots}
        self._held: dict[int, Lease] = {}
        self._ports: set[int] = set()
        self._lock = threading.Lock()
        self._port_range = listen_range()     # below the ephemeral range: no client connection takes one
        lo, hi = self._port_range
        self._next_port = lo + (os.getpid() * 97) % (hi - lo - PORTS_PER_LEASE)

    @classmethod
    def for_host(cls, gpus: Sequence[int], *, physical: bool, sys_root: Path = Path("/sys")) -> "GpuPool":
        """The pool of this host: NUMA-local core shares where NVML and /sys say where each GPU is."""
        numa = numa_cores(nvml_bus_ids(gpus), sys_root) if physical else None
        return cls(gpus, physical=physical, numa=numa)

    def free(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(s for s in self.slots if s not in self._held)

    def held(self) -> list[Lease]:
        with self._lock:
            return list(dict.fromkeys(self._held.values()))

    def try_lease(self, n: int, *, exclusive: bool = False) -> Lease | None:
        """`n` free slots (the lowest-numbered, which keeps NUMA neighbours together), or None.
        An exclusive lease needs the whole pool idle and takes every slot."""
        with self._lock:
            if any(lease.exclusive for lease in self._held.values()):
                return None
            free = [s for s in self.slots if s not in self._held]
            if exclusive:
                if len(free) != len(self.slots):
                    return None
                take = free
            else:
                if n > len(free) or n < 0:
                    return None
                take = self._pick(free, n)
            cores = tuple(sorted({c for s in take for c in self.share[s]}))
            lease = Lease(host=self.host, gpus=tuple(take) if self.physical else (), slots=tuple(take),
                          cores=cores, port_base=self._port_block(), exclusive=exclusive)
            for s in take:
                self._held[s] = lease
            self._ports.add(lease.port_base)
            return lease

    def _pick(self, free: list[int], n: int) -> list[int]:
        """The first NUMA node with `n` free slots, so a 2-GPU trial does not straddle sockets; else
        the lowest-numbered free slots."""
        by_node: dict[tuple[int, ...], list[int]] = {}
        for s in free:
            by_node.setdefault(self.node[s], []).append(s)
        for key, members in by_node.items():
            if key and len(members) >= n:
                return members[:n]
        return free[:n]

    def _port_block(self) -> int:
        lo, hi = self._port_range
        for _ in range(2000):
            base = self._next_port
            self._next_port = lo + (self._next_port - lo + PORTS_PER_LEASE) % (hi - lo - PORTS_PER_LEASE)
            if base in self._ports:
                continue
            if _port_block_free(base, PORTS_PER_LEASE):
                return base
        raise RuntimeError("no free block of ports found")

    def release(self, lease: Lease) -> None:
        with self._lock:
            for s in lease.slots:
                if self._held.get(s) == lease:
                    del self._held[s]
            self._ports.discard(lease.port_base)
