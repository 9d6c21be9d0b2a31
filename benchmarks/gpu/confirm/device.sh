#!/bin/bash
# The device side of the H200 confirmation of the committed FP8 study (benchmarks/gpu/quality), one
# device call each; see RESULTS.md here for the order. Every call first does:
#   export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
#   bash benchmarks/gpu/confirm/device.sh models        # background: write the 8B model to /tmp/models
#   T0=$(date +%s) bash benchmarks/gpu/confirm/device.sh confirm TAG
#   T0=$(date +%s) bash benchmarks/gpu/confirm/device.sh recheck TAG   # one repeat again (RESULTS.md)
# The study DB lives in /tmp/h200 while the machine stays warm; each call also sends it back, and a
# copy committed here as q.db is where a fresh machine would resume from.
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
C=benchmarks/gpu/confirm
T0=${T0:-$(date +%s)}
LIMIT=${LIMIT:-600}          # the device call's limit; everything here must end inside it
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DB=/tmp/h200/q.db

source benchmarks/gpu/models.sh

left() { echo $(( LIMIT - ($(date +%s) - T0) )); }

models() {   # the writer runs on in the background while the next calls copy the vLLM parts
  write_models "python3 /tmp/msrc/make_model.py /tmp/models/llama8b"
}

confirm() {   # confirm TAG: as many repeats as fit in this call
  local tag=$1
  wait_models
  mkdir -p /tmp/h200
  if [ ! -f "$DB" ]; then
    if [ -f $C/q.db ]; then cp $C/q.db "$DB"; else cp benchmarks/gpu/quality/h200-llama8b-quality.db "$DB"; fi
  fi
  local t=$(( $(left) - 30 ))
  echo "autotune confirm with --timeout ${t}s"
  python3 -m autotune confirm --storage "sqlite:///$DB" --top 2 --repeats 3 --timeout "${t}s" 2>&1 | tee "$OUT/confirm-$tag.log"
  python3 -m autotune show --storage "sqlite:///$DB" > "$OUT/show-$tag.txt" 2>&1
  cp "$DB" "$OUT/q.db"
  (cd /tmp/h200 && tar czf "$OUT/logs-$tag.tgz" *-logs/confirm-*.log)
  nvidia-smi > "$OUT/smi-$tag.txt" 2>&1
  echo "confirm step done, $(left) s left"
}

recheck() {   # recheck TAG: the baseline's round-3 repeat again, with the claim check of fe10992, on a copy
  local tag=$1 db=/tmp/h200/recheck.db
  wait_models
  mkdir -p /tmp/h200 && cp $C/q.db $db
  python3 - "$db" <<'PY'
import sqlite3, sys
with sqlite3.connect(sys.argv[1]) as c:
    n = c.execute("delete from autotune_confirmations where round = 2 and trial_id = "
                  "(select id from autotune_trials where number = 0)").rowcount
    print(f"removed {n} row: the baseline's round-3 repeat, to be measured again")
PY
  python3 -m autotune confirm --storage "sqlite:///$db" --top 2 --repeats 3 --timeout "$(( $(left) - 20 ))s" 2>&1 | tee "$OUT/recheck-$tag.log"
  python3 -m autotune show --storage "sqlite:///$db" > "$OUT/show-recheck-$tag.txt" 2>&1
  cp "$db" "$OUT/recheck.db"
  (cd /tmp/h200 && tar czf "$OUT/logs-recheck-$tag.tgz" h200-llama8b-quality-logs/confirm-0000-r2.log)
  echo "recheck done, $(left) s left"
}

step=$1; shift
"$step" "$@"
