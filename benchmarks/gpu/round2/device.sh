#!/bin/bash
# The device-side steps of GPU round 2 (two H200s), one call each; see RESULTS.md for the order.
# Every call first does: export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 (and the
# NVLink-multicast variables, also set here so that no step can forget them).
#   bash benchmarks/gpu/round2/device.sh models               # background: write both models to /tmp/models
#   T0=$(date +%s) bash benchmarks/gpu/round2/device.sh study dense|moe TAG [SECONDS]
#   T0=$(date +%s) bash benchmarks/gpu/round2/device.sh corun TAG
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu/round2
T0=${T0:-$(date +%s)}
LIMIT=${LIMIT:-600}          # the device call's limit; everything here must end inside it
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"

source benchmarks/gpu/models.sh

left() { echo $(( LIMIT - ($(date +%s) - T0) )); }

nvml_log() {   # per-GPU NVML readings, 1 Hz, for the whole call
  nvidia-smi --query-gpu=timestamp,index,power.draw,utilization.gpu,utilization.memory,memory.used,clocks.sm,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 1000 > "$1" 2>&1 &
  NVML_PID=$!
}

models() {   # the writer runs on in the background while the next calls copy the vLLM parts
  write_models "python3 /tmp/msrc/make_model.py /tmp/models/llama8b && python3 /tmp/msrc/make_moe.py /tmp/models/mixtral"
}

study() {   # study dense|moe TAG [seconds for autotune]
  local spec=$R/h200x2-$1.yaml tag=$2
  local db=$R/h200x2-$([ "$1" = dense ] && echo dense || echo mixtral).db
  wait_models
  nvml_log "$OUT/nvml-$tag.csv"
  local t=${3:-$(( $(left) - 45 ))}
  echo "autotune run with --timeout ${t}s"
  python3 -m autotune run --study "$spec" --n-trials 3 --timeout "${t}s" --no-progress 2>&1 | tee "$OUT/run-$tag.log"
  kill "$NVML_PID"
  python3 -m autotune show --storage "sqlite:///$db" > "$OUT/show-$tag.txt" 2>&1
  python3 -m autotune show --storage "sqlite:///$db" --json > /tmp/show-$tag.json 2>&1
  cp "$db" "$OUT/"
  tar czf "$OUT/logs-$tag.tgz" -C $R $(cd $R && ls -d *-logs) -C /tmp show-$tag.json models/make.log 2>/dev/null
  nvidia-smi > "$OUT/smi-$tag.txt" 2>&1
  echo "study step done, $(left) s left"
}

serve() {   # serve GPU PORT CORES LOG: one tp1 server of the 8B model, its process group id in SERVE_PID
  CUDA_VISIBLE_DEVICES=$1 setsid taskset -c "$3" python3 -m vllm.entrypoints.openai.api_server \
    --model /tmp/models/llama8b --max-model-len 4096 --host 127.0.0.1 --port "$2" > "$4" 2>&1 < /dev/null &
  SERVE_PID=$!
}

ready() {
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$1/health" > /dev/null && return 0; sleep 1; done
  return 1
}

bench() {   # bench PORT NAME CORES SEED: fixed concurrency 32, 256 measured requests after 32 warm-up
  taskset -c "$3" python3 -m autotune bench --url "http://127.0.0.1:$1" --model /tmp/models/llama8b \
    --workload random:input_len=1024,output_len=128 --concurrency 32 --num-requests 192 --warmup 32 \
    --seed "$4" --slo 'ttft:p99<=1s' --json "/tmp/corun/$2.json" > "/tmp/corun/$2.txt" 2>&1
}

corun() {   # two identical one-GPU servers, each benched alone and then both at the same time
  local tag=$1
  wait_models
  mkdir -p /tmp/corun
  nvml_log "$OUT/nvml-$tag.csv"
  serve 0 8100 0-15 /tmp/corun/server-gpu0.log; local A=$SERVE_PID
  serve 1 8101 16-31 /tmp/corun/server-gpu1.log; local B=$SERVE_PID
  ready 8100 && ready 8101 || echo "a server did not start"
  echo "servers ready at $(( $(date +%s) - T0 )) s"
  bench 8100 alone-gpu0-a 0-15 11
  bench 8101 alone-gpu1-a 16-31 12
  bench 8100 together-gpu0 0-15 13 & local P=$!
  bench 8101 together-gpu1 16-31 14
  wait $P
  kill -TERM -- -"$A" -"$B" 2>/dev/null; sleep 5; kill -KILL -- -"$A" -"$B" 2>/dev/null
  kill "$NVML_PID"
  for f in /tmp/corun/*.txt; do echo "== $f"; tail -25 "$f"; done | tee "$OUT/corun-$tag.txt"
  gzip -f /tmp/corun/server-*.log
  tar czf "$OUT/corun-$tag.tgz" -C /tmp corun
  echo "corun done, $(left) s left"
}

step=$1; shift
"$step" "$@"
