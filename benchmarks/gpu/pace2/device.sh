#!/bin/bash
# The device side of issue 12 item 6's second "after" run (RESULTS.md here): the 8B study alone on a cold
# one-H200 machine, with the capacity search started near the study's capacities and the twin ranking
# beside the baseline's start. Every call first does:
#   export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
#   bash benchmarks/gpu/pace2/device.sh models          # once, background: the 8B model into /tmp/models
#   T0=$(date +%s) bash benchmarks/gpu/pace2/device.sh go TAG   # the study, as far as the call allows
# It resumes on the next call from its DB in /tmp (kept while the machine stays warm).
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
T0=${T0:-$(date +%s)}
LIMIT=${LIMIT:-590}          # the device call's limit; everything here must end inside it
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
P=/tmp/pace2/pace2.db        # the study (its compile cache: /tmp/pace2/h200-llama8b-pace2-cache)

source benchmarks/gpu/models.sh     # write_models, wait_models, left

models() { write_models "python3 /tmp/msrc/make_model.py /tmp/models/llama8b"; }

go() {   # go TAG
  local tag=$1
  wait_models
  mkdir -p /tmp/pace2
  local soft=$(( $(left) - 50 )) hard=$(( $(left) - 25 ))
  echo "study with --timeout ${soft}s (SIGTERM at ${hard}s)"
  timeout -s TERM "$hard" python3 -m autotune run --study benchmarks/gpu/pace2/study.yaml \
      --storage "sqlite:///$P" --n-trials 40 --timeout "${soft}s" --no-progress --no-confirm \
      > "$OUT/pace2-$tag.log" 2>&1
  echo "run exit $?"
  python3 -m autotune show --storage "sqlite:///$P" --json > "$OUT/show-pace2-$tag.json" 2>&1
  cp "$P" "$OUT/pace2.db"
  (cd /tmp && tar czf "$OUT/logs-$tag.tgz" pace2/*-logs; nvidia-smi > "$OUT/nvidia-smi-$tag.txt" 2>&1)
  echo "go $tag done, $(left) s left"
}

step=$1; shift
"$step" "$@"
