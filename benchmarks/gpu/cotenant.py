"""Hold GPU memory like another tenant of a shared GPU, until killed or `seconds` pass.

Used once in the H200 run so that a candidate meets what shared GPUs really do to vLLM: free memory
below the requested utilization at startup, which autotune must classify (startup_oom) and survive.

    python3 benchmarks/gpu/cotenant.py GIB SECONDS
"""

import sys
import time

import torch

gib, seconds = float(sys.argv[1]), float(sys.argv[2])
block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
block.fill_(1)
torch.cuda.synchronize()
print(f"cotenant: holding {gib:g} GiB for up to {seconds:g} s", flush=True)
time.sleep(seconds)
