"""Prefill/decode (PD) disaggregated layouts as a candidate's flags: the one grammar the space, the engines,
the twin and the driver read, so that all of them agree on what `1p1d` launches.

A PD layout is a choice of `parallel_layout` whose flags are autotune's own, never sent to vLLM:
`--pd-prefill N --pd-decode M` (N prefill instances, M decode instances, each with the candidate's other
flags, so each with its own TP x PP x DP GPUs) and the connector's knobs (`--pd-kv-buffer-device`). The
engine layer (engine/deployment.py) turns them into N + M servers with a `--kv-transfer-config` each and
a router in front.

    >>> layout, rest = split_pd_flags(["--max-num-seqs", "64", "--pd-prefill", "1", "--pd-decode", "2"])
    >>> layout.label, layout.instances, rest
    ('1p2d', 3, ['--max-num-seqs', '64'])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from autotune.errors import UserError

PD_PREFIX = "--pd-"
KV_TRANSFER_FLAG = "--kv-transfer-config"   # the vLLM flag a split's instances get (an engine must know it)
CONNECTOR = "NixlConnector"           # the connector the router's protocol (kv_transfer_params) belongs to
BUFFER_DEVICES = ("cuda", "cpu")      # NixlConnector's kv_buffer_device on CUDA: device memory or host staging
_KEYS = {"prefill", "decode", "kv_buffer_device"}


@dataclass(frozen=True)
class PDLayout:
    """N prefill and M decode instances of one candidate, and the connector's settings."""

    prefill: int
    decode: int
    kv_buffer_device: str = "cuda"

    @property
    def label(self) -> str:
        return f"{self.prefill}p{self.decode}d"

    @property
    def instances(self) -> int:
        return self.prefill + self.decode

    def kv_transfer_config(self) -> str:
        """The `--kv-transfer-config` JSON every instance gets. NixlConnector runs `kv_both` on both sides:
        the router says per request which side an instance plays (kv_transfer_params)."""
        cfg: dict[str, Any] = {"kv_connector": CONNECTOR, "kv_role": "kv_both"}
        if self.kv_buffer_device != "cuda":
            cfg["kv_buffer_device"] = self.kv_buffer_device
        return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def is_pd_flag(flag: str) -> bool:
    """Whether a `--flag` is autotune's own PD grammar (never sent to vLLM, never checked against --help)."""
    return str(flag).startswith(PD_PREFIX)


def _count(name: str, value: Any) -> int:
    try:
        n = int(str(value))
    except ValueError:
        raise UserError(f"--pd-{name} {value!r}: expected a whole number of instances >= 1") from None
    if n < 1:
        raise UserError(f"--pd-{name} {value!r}: expected a whole number of instances >= 1")
    return n


def layout_of(mapping: Mapping[str, Any]) -> PDLayout | None:
    """The PD layout a flag mapping (flags_to_mapping's form: `pd_prefill: "1"`) names, or None."""
    found = {k[3:]: v for k, v in mapping.items() if str(k).startswith("pd_")}
    if not found:
        return None
    unknown = sorted(set(found) - _KEYS)
    if unknown:
        raise UserError(f"--pd-{unknown[0].replace('_', '-')}: not a PD layout flag (known: --pd-prefill, "
                        "--pd-decode, --pd-kv-buffer-device)")
    if "prefill" not in found or "decode" not in found:
        raise UserError("a PD layout needs both --pd-prefill and --pd-decode")
    device = str(found.get("kv_buffer_device") or "cuda")
    if device not in BUFFER_DEVICES:
        raise UserError(f"--pd-kv-buffer-device {device!r}: one of {', '.join(BUFFER_DEVICES)}")
    return PDLayout(_count("prefill", found["prefill"]), _count("decode", found["decode"]), device)


def split_pd_flags(flags: Sequence[str]) -> tuple[PDLayout | None, list[str]]:
    """(the PD layout, the flags every instance gets): `--pd-*` items and their values taken out."""
    from autotune.flags import flags_to_mapping

    rest: list[str] = []
    mine: list[str] = []
    items = [str(f) for f in flags]
    i = 0
    while i < len(items):
        item = items[i]
        if is_pd_flag(item):
            mine.append(item)
            if "=" not in item and i + 1 < len(items) and not items[i + 1].startswith("--"):
                mine.append(items[i + 1])
                i += 1
        else:
            rest.append(item)
        i += 1
    return layout_of(flags_to_mapping(mine)), rest


def gpus_of(mapping: Mapping[str, Any]) -> int:
    """GPUs a launch takes: TP x PP x DP of one engine instance times its instances (PD layouts)."""
    from autotune.flags import parallel_size

    return parallel_size(mapping) * instances_of(mapping)


def instances_of(mapping: Mapping[str, Any]) -> int:
    """Engine instances a flag mapping launches: prefill + decode for a PD layout, else 1. Multiplied by
    TP x PP x DP, it is the GPUs a candidate needs. A malformed PD mapping counts as 1 (the launch says why)."""
    try:
        layout = layout_of(mapping)
    except UserError:
        return 1
    return layout.instances if layout is not None else 1
