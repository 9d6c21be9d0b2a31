#!/usr/bin/env python3
"""Repack the offline vLLM bundle of shared/gpu/fetch_vllm_wheels.py (OUT/p1..pN, OUT/d1..dK) into as few
device calls as the 64 MiB transfer limit allows: OUT/b1..bM, each at most --cap-mib MiB of dependency
wheels plus the next slice of the vLLM wheel (files part01, part02, ...; install.sh cats them in name
order). Why: the bundle's 40 MiB pK beside an 18 MiB dK and the 14.5 MiB tree is 72.5 MiB, over the limit,
so as built it needs 9 calls; repacked, 7. b1 holds pydantic and its own dependencies, so the first call
can install those alone and start the model writer (`autotune demo-model` imports autotune.spec, which
needs pydantic, absent from the device image) while the other parts travel.

    python3 benchmarks/gpu/vlm/repack.py .gpu [--cap-mib 48.8] [--calls 7]   # then delete .gpu/p* .gpu/d*
"""
import argparse
import glob
import os
import shutil

FIRST = ("pydantic", "pydantic_core", "typing_inspection", "annotated_types")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cap-mib", type=float, default=48.8)   # 64 MiB less the 14.5 MiB tree, less a margin
    ap.add_argument("--calls", type=int, default=7)
    a = ap.parse_args()
    cap, n = int(a.cap_mib * 2**20), a.calls
    wheels = sorted(glob.glob(os.path.join(a.out, "d*", "*.whl")), key=os.path.getsize, reverse=True)
    bins: list[list[str]] = [[] for _ in range(n)]
    size = [0] * n
    for w in wheels:   # pydantic's group into b1, the rest largest first into the emptiest
        j = 0 if os.path.basename(w).split("-")[0] in FIRST else size.index(min(size))
        bins[j].append(w)
        size[j] += os.path.getsize(w)
    pieces = sorted(glob.glob(os.path.join(a.out, "p*", "part[0-9][0-9]")), key=lambda p: os.path.basename(p))
    blob = b"".join(open(p, "rb").read() for p in pieces)
    if len(blob) + sum(size) > cap * n:
        raise SystemExit(f"{len(blob) + sum(size)} bytes do not fit {n} calls of {cap}: raise --calls")
    off = 0
    for j in range(n):
        d = os.path.join(a.out, f"b{j + 1}")
        os.makedirs(d)
        for w in bins[j]:
            shutil.copy(w, d)
        take = max(0, min(cap - size[j], len(blob) - off))
        with open(os.path.join(d, f"part{j + 1:02d}"), "wb") as f:
            f.write(blob[off:off + take])
        off += take
    print(f"{a.out}: b1..b{n}, {len(wheels)} wheels and the vLLM wheel in {n} slices of <= {a.cap_mib} MiB")


if __name__ == "__main__":
    main()
