"""The KV hand-off of a prefill/decode split: how many bytes one request's prompt moves from a prefill
instance to a decode instance, and how long that takes over the link between their GPUs.

Assumptions (stated, not measured: only one GPU was lent while this was written, issue 26):
- Prefill and decode instances sit on one host and NIXL moves the KV GPU-to-GPU over NVLink (UCX's
  cuda_ipc transport), at the catalog's one-direction link bandwidth per GPU (`GPU.link_gbps`: 450 GB/s
  on H100/H200, 32 GB/s PCIe on L40S), each GPU of a TP group sending its own shard in parallel.
- The link runs at LINK_EFFICIENCY of its peak for these block-sized copies, and each hand-off pays a
  fixed TRANSFER_OVERHEAD_S (the side-channel handshake, the block-id exchange, the notification).
- With `kv_buffer_device: cpu` the KV is staged through host memory: two PCIe copies at HOST_STAGING_GBPS.
- Each hand-off has the link to itself: concurrent hand-offs do not share its bandwidth (optimistic under
  heavy traffic of long prompts), and the transfer does not slow the steps of either instance.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.perfmodel.predict import Plan

LINK_EFFICIENCY = 0.7
TRANSFER_OVERHEAD_S = 0.5e-3
HOST_STAGING_GBPS = 25.0          # PCIe Gen5 x16, one direction, as achieved by pinned copies


@dataclass(frozen=True)
class Transfer:
    """One request's KV hand-off."""

    tokens: int
    bytes_per_gpu: float          # what each GPU of the prefill instance sends
    seconds: float
    link_gbps: float              # the effective bandwidth used (GB/s per GPU)


def link_gbps(plan: Plan, kv_buffer_device: str = "cuda") -> float:
    """Effective GB/s per GPU of the hand-off: the GPU link at LINK_EFFICIENCY, or host staging (two
    copies through PCIe) with a CPU buffer, whichever is slower."""
    link = plan.gpu.link_gbps * LINK_EFFICIENCY
    if kv_buffer_device == "cpu":
        return min(link, HOST_STAGING_GBPS / 2)
    return link


def transfer(plan: Plan, prompt_tokens: int, kv_buffer_device: str = "cuda") -> Transfer:
    """The hand-off of a prompt of `prompt_tokens`: its KV (all layers, this instance's TP shard per GPU)
    over the link, plus the fixed overhead."""
    per_gpu = plan.budget.kv_bytes_per_token * max(prompt_tokens, 0)
    gbps = link_gbps(plan, kv_buffer_device)
    return Transfer(prompt_tokens, per_gpu, per_gpu / (gbps * 1e9) + TRANSFER_OVERHEAD_S, gbps)
