#!/bin/bash
# The device side of issue 24 item 5: three studies on one H200 (studies/h200-knobs-{chat,long,decode}.yaml,
# the 8B-shaped random-weight model, vLLM 0.24 from the shared/gpu bundle), each ending in the
# confirmation. Every device call (10 minutes at most) first does:
#   export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
#   bash benchmarks/gpu/knobs/device.sh models                 # once per machine, background: /tmp/models/llama8b
#   T0=$(date +%s) bash benchmarks/gpu/knobs/device.sh go chat c1   # a study (chat | long | decode), as far as
#                                                              # the call allows; the next call resumes it
#   bash benchmarks/gpu/knobs/device.sh collect chat           # show, report, export into $OUT (no GPU)
# A study's DB and caches live in /tmp/knobs (kept while the machine stays warm); `go` copies the DB to
# $OUT after every call, and `go` on a fresh machine with that DB put back at /tmp/knobs/STUDY.db resumes.
# A one-GPU call may get an H200 or an H100, and a study stays on the card it began on: `restore` puts
# back the DBs of the studies begun on the card that came, `start DEADLINE auto` resumes them (RESULTS.md
# has the whole recipe).
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
T0=${T0:-$(date +%s)}
LIMIT=${LIMIT:-590}          # the device call's limit; everything here must end inside it
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=/tmp/knobs

source benchmarks/gpu/models.sh     # write_models, wait_models, left

models() { write_models "python3 /tmp/msrc/make_model.py /tmp/models/llama8b"; }

go() {   # go STUDY TAG: the study (n_trials from its spec, then the confirmation), until the call's time is up
  local study=$1 tag=$2
  wait_models
  mkdir -p "$D"
  local soft=$(( $(left) - 50 )) hard=$(( $(left) - 25 ))
  echo "h200-knobs-$study with --timeout ${soft}s (SIGTERM at ${hard}s)"
  timeout -s TERM "$hard" python3 -m autotune run --study "studies/h200-knobs-$study.yaml" \
      --storage "sqlite:///$D/$study.db" --timeout "${soft}s" --no-progress > "$OUT/$study-$tag.log" 2>&1
  echo "run exit $?"
  python3 -m autotune show --storage "sqlite:///$D/$study.db" > "$OUT/show-$study-$tag.txt" 2>&1
  cp "$D/$study.db" "$OUT/$study.db"
  (cd /tmp && tar czf "$OUT/logs-$study-$tag.tgz" knobs/*-logs 2>/dev/null; nvidia-smi > "$OUT/nvidia-smi-$tag.txt" 2>&1)
  echo "go $study $tag done, $(left) s left"
}

deadline() {   # deadline STUDY TAG: issue 22's "a --timeout after a trial's last step leaves it ok", on the GPU.
  # The run's deadline is a timer that sends the process SIGUSR1 (node/interrupts.py); this delivers that
  # signal at the moment the first trial logs "stopping server" (its last load step is done), which
  # a wall-clock --timeout can only hit by luck. The run is armed with a --timeout so the handler exists.
  local study=$1 tag=$2 log="$OUT/$1-$2.log"
  wait_models
  mkdir -p "$D"
  python3 -m autotune run --study "studies/h200-knobs-$study.yaml" --storage "sqlite:///$D/$study.db" \
      --timeout "$(( $(left) - 30 ))s" --no-progress > "$log" 2>&1 &
  local pid=$!
  until grep -q "stopping server" "$log" 2>/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "run ended before a trial stopped its server"; break; }
    sleep 0.2
  done
  kill -USR1 $pid 2>/dev/null && echo "deadline delivered at $(date +%T) after: $(grep -m1 'stopping server' -B2 "$log" | head -2 | tr '\n' ' ')"
  wait $pid; echo "run exit $?"
  tail -4 "$log"
  python3 -m autotune show --storage "sqlite:///$D/$study.db" > "$OUT/show-$study-$tag.txt" 2>&1
  cp "$D/$study.db" "$OUT/$study.db"
  (cd /tmp && tar czf "$OUT/logs-$study-$tag.tgz" knobs/*-logs 2>/dev/null)
}

# The studies can also run in the background for the whole lease, under setsid so that they outlive the
# call that started them, while later calls only watch (no call's margins cut a trial or a repeat):
#   bash benchmarks/gpu/knobs/device.sh start DEADLINE long chat   # DEADLINE: epoch seconds; then watch
#   T0=$(date +%s) bash benchmarks/gpu/knobs/device.sh watch c11        # every next call, within 30 s
#   ROUNDS_decode=5 bash benchmarks/gpu/knobs/device.sh start ...      # a study's confirmation to 5 rounds
start() {   # start DEADLINE STUDY...: `chain` in the background, from a copy of the tree in /tmp/asrc
  wait_models
  mkdir -p "$D" /tmp/asrc/benchmarks/gpu/knobs && rm -f "$D/chain.done"
  rm -rf /tmp/asrc/autotune && cp -r autotune search_spaces studies /tmp/asrc/
  cp benchmarks/gpu/models.sh /tmp/asrc/benchmarks/gpu/ && cp "$0" /tmp/asrc/benchmarks/gpu/knobs/device.sh
  (cd /tmp/asrc && PYTHONPATH=/tmp/asrc setsid nohup bash benchmarks/gpu/knobs/device.sh chain "$@" \
      > "$D/chain.log" 2>&1 < /dev/null &)
  sleep 1; cat "$D/chain.log"
}

card() {   # h200, h100 or other: the card this machine has. A one-GPU call may get either kind, and a
  # study stays on the card it began on (tuner/sharing.py refuses a resume on another GPU model), so the
  # studies begun on an H200 keep their names and DBs, and another card's are named for it
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) echo h200 ;; *H100*) echo h100 ;; *) echo other ;;
  esac
}

restore() {   # the DBs of the studies this card has begun, from the repository's .db.gz files, into $D
  local c f
  c=$(card); mkdir -p "$D"
  if [ "$c" = h200 ]; then
    for f in long chat decode; do
      [ -f "benchmarks/gpu/knobs/$f.db.gz" ] && gunzip -c "benchmarks/gpu/knobs/$f.db.gz" > "$D/$f.db"
    done
  else
    for f in benchmarks/gpu/knobs/"$c"-*.db.gz; do
      [ -f "$f" ] && gunzip -c "$f" > "$D/$(basename "$f" .gz)"
    done
  fi
  echo "$c: $(cd "$D" && ls ./*.db 2>/dev/null | tr '\n' ' ')"
}

chain() {   # chain DEADLINE STUDY...|auto: each study in turn (its trials, then its confirmation) until
  # DEADLINE; `auto`: on the H200 the three studies begun there, on another card the decode study first
  # (none of it ran anywhere yet), then chat, then decode-ablate (`ablate_decode`), then long
  local deadline=$1 study t c name db more need; shift
  c=$(card)
  if [ "$*" = auto ]; then
    if [ "$c" = h200 ]; then set -- long chat decode; else set -- decode chat decode-ablate long; fi
  fi
  for study in "$@"; do
    if [ "$study" = decode-ablate ]; then ablate_decode "$deadline" "$c"; continue; fi
    name=h200-knobs-$study db=$D/$study.db
    [ "$c" = h200 ] || { name=$c-knobs-$study; db=$D/$c-$study.db; }
    t=$(( deadline - $(date +%s) )) need=200
    # a study not begun has no trial times for the run to judge by, and its first trial, the baseline,
    # searches from one stream (380 s on the H100 decode study): begun in less, it would be cut
    [ -f "$db" ] || need=${NEED_NEW:-600}     # NEED_NEW: less, where the lease holds one baseline only
    if [ "$t" -lt "$need" ]; then echo "$(date +%T) $name: not started, ${t} s left"; continue; fi
    echo "$(date +%T) $name with --timeout ${t}s"
    python3 -m autotune run --study "studies/h200-knobs-$study.yaml" --study-name "$name" \
        --storage "sqlite:///$db" --timeout "${t}s" --no-progress >> "$D/run-$name.log" 2>&1
    echo "$(date +%T) $name: exit $?"
    more=ROUNDS_${study//-/_}; more=${!more:-}   # e.g. ROUNDS_decode=5: more paired rounds than the spec's 3,
    t=$(( deadline - $(date +%s) ))       # where every round leaned one way and the interval still held 1
    if [ -n "$more" ] && [ "$t" -ge 200 ]; then
      echo "$(date +%T) $name: confirm --repeats $more with --timeout ${t}s"
      python3 -m autotune confirm --storage "sqlite:///$db" --study-name "$name" --repeats "$more" \
          --timeout "${t}s" >> "$D/run-$name.log" 2>&1
      echo "$(date +%T) $name: confirm exit $?"
    fi
  done
  touch "$D/chain.done"
}

ablate_decode() {   # ablate_decode DEADLINE CARD: `autotune ablate` of the decode study's #1 (the spec's first
  # enqueued candidate: stream interval 8, capture size 1024), its stream interval alone beside #1 whole and
  # the defaults, in paired rounds: which knob carried #1's lead (RESULTS.md, session 31). Its DB is
  # STUDYNAME-ablate-1.db beside the decode study's.
  local deadline=$1 c=$2 name=$2-knobs-decode src=$D/$2-decode.db t need=200
  [ "$c" = h200 ] && src=$D/decode.db
  if [ ! -f "$src" ]; then echo "$(date +%T) $name-ablate-1: no decode study on this card"; return; fi
  [ -f "$D/$name-ablate-1.db" ] || need=600     # not begun: see `chain`
  t=$(( deadline - $(date +%s) ))
  if [ "$t" -lt "$need" ]; then echo "$(date +%T) $name-ablate-1: not started, ${t} s left"; return; fi
  echo "$(date +%T) $name-ablate-1 with --timeout ${t}s"
  python3 -m autotune ablate --study studies/h200-knobs-decode.yaml --study-name "$name" \
      --storage "sqlite:///$src" --trial 1 --knobs stream_interval --timeout "${t}s" --no-progress \
      >> "$D/run-$name-ablate-1.log" 2>&1
  echo "$(date +%T) $name-ablate-1: exit $?"
}

watch() {   # watch TAG: until the chain is done or this call is nearly out of time, then into $OUT a
  # consistent copy of every study DB (sqlite's backup, the run may be writing; gzipped, because a raw DB
  # of 12 decode trials, 19.9 MB, was over what a call brings back), show, the logs
  # TAIL: the seconds kept for the copies (75; a short lease with one small DB can keep fewer)
  local db study
  until [ -f "$D/chain.done" ] || [ "$(left)" -lt "${TAIL:-75}" ]; do sleep 5; done
  cat "$D/chain.log"
  for db in "$D"/*.db; do
    study=$(basename "$db" .db)
    python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" "$db" "$OUT/$study.db"
    python3 -m autotune show --storage "sqlite:///$OUT/$study.db" > "$OUT/show-$study-$1.txt" 2>&1
    gzip -6 -f "$OUT/$study.db"
  done
  tail -n 3 "$D"/run-*.log 2>/dev/null
  (cd /tmp && tar czf "$OUT/logs-$1.tgz" knobs/*.log knobs/*-logs 2>/dev/null; nvidia-smi > "$OUT/nvidia-smi-$1.txt" 2>&1)
  echo "watch $1 done, $(left) s left, chain $( [ -f "$D/chain.done" ] && echo done || echo running)"
}

collect() {   # collect STUDY: what RESULTS.md quotes (no GPU needed)
  local study=$1
  local url="sqlite:///$D/$study.db"     # (one `local` expands every word before it assigns any)
  python3 -m autotune show --storage "$url" > "$OUT/show-$study.txt" 2>&1
  python3 -m autotune show --storage "$url" --json > "$OUT/show-$study.json" 2>&1
  python3 -m autotune report --storage "$url" -o "$OUT/report-$study.html"
  python3 -m autotune export --storage "$url" --format vllm-yaml -o "$OUT/best-$study.yaml" \
    || echo "nothing exported for $study (see show)"
}

step=$1; shift
"$step" "$@"
