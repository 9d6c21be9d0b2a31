#!/bin/bash
# The device side of issue 25 item 6: a Qwen2.5-VL-7B-shaped random-weight model on one H200 under mixed
# traffic (studies/h200-qwen2.5-vl-7b-images.yaml) beside the same model on text alone
# (studies/h200-qwen2.5-vl-7b-text.yaml), then the text study's winner measured under the images.
# Every call first does:
#   export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
# and then one of (in this order; each step resumes from its DB in /tmp/vlm while the machine stays warm):
#   bash benchmarks/gpu/vlm/device.sh models               # background: the 8.3B VLM into /tmp/models (GPU init)
#   bash benchmarks/gpu/vlm/device.sh estimate             # the twin's budget and curve, before any launch
#   T0=$(date +%s) bash benchmarks/gpu/vlm/device.sh go text TAG      # the text study, as far as the call allows
#   T0=$(date +%s) bash benchmarks/gpu/vlm/device.sh go images TAG    # the image study
#   T0=$(date +%s) bash benchmarks/gpu/vlm/device.sh confirm images|cross|text TAG  # one confirmation, resumable
#   T0=$(date +%s) bash benchmarks/gpu/vlm/device.sh chain TAG   # every call after the install: the confirmations
#                                                                # in priority order, evidence in $OUT/TAG.tgz
#   T0=$(date +%s) bash benchmarks/gpu/vlm/device.sh cross TAG        # the text winner under the image traffic
# Every call sends back the DBs, `show` and the trial logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
T0=${T0:-$(date +%s)}
LIMIT=${LIMIT:-590}          # the device call's limit; everything here must end inside it
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=/tmp/models/qwen2.5-vl-7b
D=${D:-/tmp/vlm}
R=${R:-/tmp/res}

source benchmarks/gpu/models.sh     # write_models, wait_models, left

models() {   # ~17 GB of bf16 weights made on the GPU by transformers: well under a minute after the imports
  write_models "cd /tmp/msrc && python3 -m autotune demo-model $MODEL --vlm qwen2_5_vl --size 7b"
}

estimate() {   # the twin's figures to put beside the measured ones (KV tokens: the baseline trial's log line)
  wait_models
  python3 -m autotune estimate --gpu H200 --model-profile "$MODEL" --input-len 512 --output-len 128 \
      --image-size 1024x768 --images 2 --image-share 0.3 --json -- --max-model-len 16384 > "$OUT/estimate-images.json"
  python3 -m autotune estimate --gpu H200 --model-profile "$MODEL" --input-len 512 --output-len 128 \
      -- --max-model-len 16384 > "$OUT/estimate-text.txt"
  python3 -m autotune estimate --gpu H200 --model-profile "$MODEL" --input-len 512 --output-len 128 \
      --image-size 1024x768 --images 2 --image-share 0.3 --no-curve -- --max-model-len 16384 | tee "$OUT/estimate-images.txt"
}

_run() {   # _run STUDY_FILE DB TAG EXTRA...: the study with --timeout inside this call, then its evidence
  local spec=$1 db=$2 tag=$3; shift 3
  wait_models
  mkdir -p $D
  local soft=$(( $(left) - 50 )) hard=$(( $(left) - 25 ))
  echo "study $spec with --timeout ${soft}s (SIGTERM at ${hard}s)"
  timeout -s TERM "$hard" python3 -m autotune run --study "$spec" --model "$MODEL" --storage "sqlite:///$db" \
      --timeout "${soft}s" --no-progress "$@" > "$OUT/run-$tag.log" 2>&1
  echo "run exit $?"
  _evidence "$db" "$tag"
}

_evidence() {   # _evidence DB TAG
  python3 -m autotune show --storage "sqlite:///$1" > "$OUT/show-$2.txt" 2>&1
  python3 -m autotune show --storage "sqlite:///$1" --json > "$OUT/show-$2.json" 2>&1
  cp "$1" "$OUT/"
  (cd $D && tar czf "$OUT/logs-$2.tgz" *-logs 2>/dev/null)
  nvidia-smi > "$OUT/smi-$2.txt" 2>&1
  echo "$2 done, $(left) s left"
}

go() {   # go text|images TAG: trials only (confirmation is its own step, so a call never ends inside it)
  _run studies/h200-qwen2.5-vl-7b-$1.yaml $D/$1.db "$1-$2" --no-confirm
}

confirm() {   # confirm images|text|cross TAG: --top 1 (the baseline beside it) x REPEATS rounds (3, the tool's
              # least) on fresh servers, resumable. SLACK: seconds kept back beyond the tool's own guard (a repeat
              # is not started with less than the study's median trial wall left; the baseline's runs longer).
  wait_models
  local t=$(( $(left) - 40 - ${SLACK:-0} )) hard=$(( $(left) - 20 ))
  if [ "$t" -lt 60 ]; then echo "confirm $1: ${t}s is too little"; return 0; fi
  echo "confirm $1 with --timeout ${t}s (SIGTERM at ${hard}s), $(left) s left"
  timeout -s TERM "$hard" python3 -m autotune confirm --storage "sqlite:///$D/$1.db" --top 1 --extra 0 \
      --repeats "${REPEATS:-3}" --timeout "${t}s" >> "$R/confirm-$1.log" 2>&1
  echo "confirm $1 exit $?, $(left) s left"
}

rows() {   # rows STUDY: confirmation repeats stored
  python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from autotune_confirmations').fetchone()[0])" "$D/$1.db"
}

chain() {   # chain TAG: the same command in every call after the install. Confirms images (2 configs x 3),
            # then cross (the text winner under images, 1 x 3), then text (2 x 3), each only once the one
            # before is complete; then packs the evidence into $OUT/TAG.tgz (the 8-file limit of $OUT).
  mkdir -p "$R"
  local need
  for s in images:6:60 cross:3:0 text:6:60; do
    IFS=: read -r name need slack <<< "$s"
    [ "$(rows $name)" -ge "$need" ] && { echo "$name: $need of $need repeats stored"; continue; }
    SLACK=$slack confirm $name "$1"
    echo "$name: $(rows $name) of $need repeats stored"
    [ "$(rows $name)" -ge "$need" ] || break
  done
  for s in images cross text; do
    python3 -m autotune show --storage "sqlite:///$D/$s.db" > "$R/show-$s.txt" 2>&1
    python3 -m autotune show --storage "sqlite:///$D/$s.db" --json > "$R/show-$s.json" 2>&1
    cp $D/$s.db $R/
  done
  cp /tmp/models/make.log $R/model-writer.log 2>/dev/null; nvidia-smi > $R/smi.txt 2>&1
  (cd $D && tar czf $R/confirm-logs.tgz *-logs 2>/dev/null)
  (cd $R && tar czf "$OUT/$1.tgz" .)
  echo "chain $1 packed, $(left) s left"
}

cross() {   # cross TAG: the image study's spec with the text study's exported winner as its baseline, so the
            # same capacity search (and, with --n-trials 1 and confirmation, three fresh servers) measures it
  wait_models
  if [ ! -f $D/cross.yaml ]; then
    python3 -m autotune export --storage "sqlite:///$D/text.db" --format json -o $D/text-best.json || exit 1
    python3 - "$D" <<'PY'
import json, sys, yaml
from autotune.flags import flags_to_mapping
d = sys.argv[1]
best = json.load(open(f"{d}/text-best.json"))
flags = flags_to_mapping(best["flags"])            # the study's fixed flags and the winner's own
flags.pop("max_model_len", None)                   # fixed in both specs alike
def number(v):   # '0.94' -> 0.94, '133' -> 133: a string never matches a numeric knob, and the driver then
    for cast in (int, float):   # records the space's default as the baseline's param (seen 2026-12-02)
        try:
            return cast(v)
        except (TypeError, ValueError):
            pass
    return v
flags = {k: number(v) if isinstance(v, str) else v for k, v in flags.items()}
spec = yaml.safe_load(open("studies/h200-qwen2.5-vl-7b-images.yaml"))
spec["name"] = "h200-qwen2.5-vl-7b-text-winner-under-images"
spec["baseline"] = flags
yaml.safe_dump(spec, open(f"{d}/cross.yaml", "w"))
print(f"text winner (trial {best['trial']}) as the baseline:", flags)
PY
  fi
  _run $D/cross.yaml $D/cross.db "cross-$1" --n-trials 1
}

step=$1; shift
"$step" "$@"
