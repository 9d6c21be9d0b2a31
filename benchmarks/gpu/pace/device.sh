#!/bin/bash
# The device side of two H200 runs at once on the two-GPU kind (RESULTS.md here says why and what came of
# them): GPU 0 confirms part A's output-preserving study (benchmarks/gpu/h200-llama8b.db, issue 11);
# GPU 1 runs the same 8B study afresh with today's defaults from a cold machine, for trials per GPU-hour
# (issue 12, item 6). Every call first does:
#   export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
#   bash benchmarks/gpu/pace/device.sh models          # once, background: the 8B model into /tmp/models
#   T0=$(date +%s) bash benchmarks/gpu/pace/device.sh go TAG   # both jobs, as far as the call allows
# Both resume on the next call from their DBs in /tmp (kept while the machine stays warm).
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
T0=${T0:-$(date +%s)}
LIMIT=${LIMIT:-590}          # the device call's limit; everything here must end inside it
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
A=/tmp/h200/h200-llama8b.db  # part A's study: its confirmation rows land here
P=/tmp/pace/pace.db          # the fresh study (its compile cache: /tmp/pace/h200-llama8b-pace-cache)

source benchmarks/gpu/models.sh

left() { echo $(( LIMIT - ($(date +%s) - T0) )); }

models() {
  write_models "python3 /tmp/msrc/make_model.py /tmp/models/llama8b"
}

go() {   # go TAG
  local tag=$1
  wait_models
  mkdir -p /tmp/h200 /tmp/pace
  [ -f "$A" ] || cp benchmarks/gpu/h200-llama8b.db "$A"
  local soft=$(( $(left) - 70 )) hard=$(( $(left) - 35 ))
  echo "both jobs with --timeout ${soft}s (SIGTERM at ${hard}s)"
  timeout -s TERM "$hard" python3 -m autotune confirm --storage "sqlite:///$A" --top 2 --repeats 3 \
      --timeout "${soft}s" > "$OUT/confirm-$tag.log" 2>&1 &
  local c=$!
  timeout -s TERM "$hard" python3 -m autotune run --study studies/h200-llama8b.yaml \
      --study-name h200-llama8b-pace --gpus 1 --storage "sqlite:///$P" --n-trials 40 \
      --timeout "${soft}s" --no-progress --no-confirm > "$OUT/pace-$tag.log" 2>&1 &
  local p=$!
  wait $c; echo "confirm exit $?"; wait $p; echo "pace run exit $?"
  python3 -m autotune show --storage "sqlite:///$A" > "$OUT/show-a-$tag.txt" 2>&1
  python3 -m autotune show --storage "sqlite:///$P" --json > "$OUT/show-pace-$tag.json" 2>&1
  cp "$A" "$OUT/a.db"; cp "$P" "$OUT/pace.db"
  (cd /tmp && tar czf "$OUT/logs-$tag.tgz" h200/*-logs pace/*-logs; nvidia-smi >> "$OUT/confirm-$tag.log" 2>&1)
  echo "go $tag done, $(left) s left"
}

step=$1; shift
"$step" "$@"
