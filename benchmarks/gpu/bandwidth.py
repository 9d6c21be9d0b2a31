"""Measure the GPU's device-to-device copy bandwidth: the denominator of the decode roofline
(single-stream tokens/s <= bandwidth / weight bytes)."""

import json
import sys

import torch

n = 4 * 2**30  # bytes per buffer: far above the L2
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
reps = 20
start.record()
for _ in range(reps):
    b.copy_(a)
end.record()
torch.cuda.synchronize()
seconds = start.elapsed_time(end) / 1000
gbps = 2 * n * reps / seconds / 1e9  # each copy reads and writes n bytes
out = {"device": torch.cuda.get_device_name(0), "copy_bandwidth_gb_s": round(gbps, 1)}
print(json.dumps(out))
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(json.dumps(out) + "\n")
