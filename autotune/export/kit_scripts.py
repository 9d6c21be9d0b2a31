"""The deploy kit's shell scripts. They are fixed text: everything trial-specific lives in the generated
`settings.sh` as quoted defaults, and every value, default or override, reaches vLLM as one element of
a bash array (never through eval or an unquoted expansion) after a check of its kind."""

LIBRARY = r'''
# ---- shared by deploy.sh, debug.sh, stop.sh and smoke.sh (fixed text, not trial-specific) ----
kit_fail() { printf '%s: %s\n' "$(basename -- "$0")" "$*" >&2; exit 2; }

# kit_check NAME KIND VALUE: refuse a value that is not of its kind, before anything starts
kit_check() {
  local name="$1" kind="$2" value="$3" re
  case "$kind" in
    int)   re='^[0-9]+$' ;;
    float) re='^[0-9]+([.][0-9]+)?$' ;;
    bool)  re='^[01]$' ;;
    word)  re='^[A-Za-z0-9][A-Za-z0-9._:/+=-]*$' ;;
    text)  re='^[^-[:cntrl:]][^[:cntrl:]]*$' ;;
    *)     kit_fail "internal: unknown kind $kind for $name" ;;
  esac
  [[ "$value" =~ $re ]] || kit_fail "$name=$(printf '%q' "$value") is not a valid $kind (${KIND_HELP[$kind]})"
}
declare -A KIND_HELP=([int]="a whole number" [float]="a number like 0.9" [bool]="0 or 1"
  [word]="letters, digits and ._:/+=- only" [text]="no leading '-', no control characters")

kit_setting() {   # kit_setting NAME KIND: NAME from the environment, else its default; checked
  local name="$1" kind="$2" default_var="DEFAULT_$1"
  printf -v "$name" '%s' "${!name-${!default_var}}"
  kit_check "$name" "$kind" "${!name}"
}

kit_paths() {   # where the server listens and keeps its PID and log
  kit_setting HOST word
  kit_setting PORT int
  kit_setting RUN_DIR text
  CLIENT_HOST="$HOST"
  if [[ "$HOST" == 0.0.0.0 || "$HOST" == :: ]]; then CLIENT_HOST=127.0.0.1; fi
  PID_FILE="$RUN_DIR/vllm.pid"
  LOG_FILE="$RUN_DIR/vllm.log"
}

# kit_command: CMD (the server's argv) from the defaults and the environment
kit_command() {
  kit_paths
  kit_setting MODEL text
  kit_setting STARTUP_TIMEOUT int
  CMD=("${ENGINE_CMD[@]}")
  if [[ "$MODEL_POSITIONAL" == 1 ]]; then CMD+=("$MODEL"); else CMD+=(--model "$MODEL"); fi
  CMD+=(--host "$HOST" --port "$PORT")
  SERVED="$MODEL"
  local i name kind value
  for i in "${!FLAG_VARS[@]}"; do
    name="${FLAG_VARS[$i]}" kind="${FLAG_KINDS[$i]}"
    value="${!name-${FLAG_DEFAULTS[$i]}}"
    kit_check "$name" "$kind" "$value"
    if [[ "$kind" == bool ]]; then
      if [[ "$value" == 1 ]]; then CMD+=("--${FLAG_NAMES[$i]}"); else CMD+=("--no-${FLAG_NAMES[$i]}"); fi
    else
      CMD+=("--${FLAG_NAMES[$i]}" "$value")
      if [[ "${FLAG_NAMES[$i]}" == served-model-name ]]; then SERVED="$value"; fi
    fi
  done
  for name in "${ENV_UNSTORED[@]}"; do   # the study ran with it; its value was never stored
    [[ -n "${!name+set}" ]] || kit_fail "set $name in the environment: the study ran with it, and autotune never stores an engine environment value"
  done
  KNOB_ENV=()   # NAME=value for the trial's env knobs, checked like the flags
  for i in "${!KNOB_ENV_VARS[@]}"; do
    name="${KNOB_ENV_VARS[$i]}" kind="${KNOB_ENV_KINDS[$i]}"
    value="${!name-${KNOB_ENV_DEFAULTS[$i]}}"
    kit_check "$name" "$kind" "$value"
    KNOB_ENV+=("$name=$value")
  done
}

kit_env() {   # the study's engine environment, each overridable, then the env knobs (kit_command)
  local i name
  for i in "${!ENV_VARS[@]}"; do
    name="${ENV_VARS[$i]}"
    export "$name=${!name-${ENV_DEFAULTS[$i]}}"
  done
  for i in "${!KNOB_ENV[@]}"; do export "${KNOB_ENV[$i]}"; done
}

kit_group_alive() { kill -0 -- "-$1" 2>/dev/null; }

kit_pid() {   # prints the PID of the running server (its process group leader), or fails
  [[ -f "$PID_FILE" ]] || return 1
  local pid
  pid="$(<"$PID_FILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kit_group_alive "$pid" || return 1
  printf '%s\n' "$pid"
}

kit_descendants() {   # every descendant of PID, read from ps (children that left the group included)
  ps -e -o pid=,ppid= | awk -v root="$1" '{ parent[$1] = $2 }
    END { for (p in parent) { q = parent[p]; while (q != "" && q != 0 && q != 1) {
            if (q == root) { print p; break } q = parent[q] } } }'
}
'''

DEPLOY = r'''#!/usr/bin/env bash
# Start vLLM in the background with the tuned settings and wait until it is healthy. Any setting in
# settings.sh can be overridden by an environment variable of the same name, e.g.
#   MAX_NUM_SEQS=64 ./deploy.sh        ENABLE_PREFIX_CACHING=0 ./deploy.sh        PORT=8001 ./deploy.sh
# A running server of this kit is stopped first (a redeploy). DRY_RUN=1 prints the env knobs' NAME=value
# and the command, one a line, and starts nothing.
set -euo pipefail
KIT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
. "$KIT_DIR/settings.sh"
kit_command
if [[ "${DRY_RUN-0}" == 1 ]]; then printf '%s\n' "${KNOB_ENV[@]}" "${CMD[@]}"; exit 0; fi
if kit_pid >/dev/null; then "$KIT_DIR/stop.sh"; fi
mkdir -p -- "$RUN_DIR"
kit_env
# setsid: the server and its workers get their own process group, which stop.sh signals as a whole
setsid -- "${CMD[@]}" >"$LOG_FILE" 2>&1 </dev/null &
pid=$!
printf '%s\n' "$pid" >"$PID_FILE"
printf 'started vLLM: PID %s, log %s\nwaiting for http://%s:%s/health (up to %s s)\n' \
  "$pid" "$LOG_FILE" "$CLIENT_HOST" "$PORT" "$STARTUP_TIMEOUT"
deadline=$((SECONDS + STARTUP_TIMEOUT))
until curl -fsS --noproxy '*' --max-time 5 -o /dev/null "http://$CLIENT_HOST:$PORT/health" 2>/dev/null; do
  if ! kill -0 "$pid" 2>/dev/null; then
    printf 'vLLM exited during startup; the end of %s:\n' "$LOG_FILE" >&2
    tail -n 30 -- "$LOG_FILE" >&2
    "$KIT_DIR/stop.sh" >/dev/null
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    printf 'vLLM not healthy after %s s; stopping it (log: %s)\n' "$STARTUP_TIMEOUT" "$LOG_FILE" >&2
    "$KIT_DIR/stop.sh" >&2
    exit 1
  fi
  sleep 2
done
printf 'healthy: http://%s:%s (PID %s)\n' "$CLIENT_HOST" "$PORT" "$pid"
'''

DEBUG = r'''#!/usr/bin/env bash
# The same server as deploy.sh, in the foreground with its log on the terminal (Ctrl-C stops it).
set -euo pipefail
KIT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
. "$KIT_DIR/settings.sh"
kit_command
printf '+ %s\n' "$(printf '%q ' "${KNOB_ENV[@]}" "${CMD[@]}")" >&2
if [[ "${DRY_RUN-0}" == 1 ]]; then exit 0; fi
kit_env
exec "${CMD[@]}"
'''

STOP = r'''#!/usr/bin/env bash
# Stop the server deploy.sh started: its whole process group, then any descendant that left it;
# SIGTERM first, SIGKILL after STOP_TIMEOUT seconds.
set -euo pipefail
KIT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
. "$KIT_DIR/settings.sh"
kit_paths
kit_setting STOP_TIMEOUT int
if ! pid="$(kit_pid)"; then
  rm -f -- "$PID_FILE"
  echo "not running"
  exit 0
fi
mapfile -t family < <(kit_descendants "$pid")
kill -TERM -- "-$pid" 2>/dev/null || true
for ((i = 0; i < STOP_TIMEOUT * 2; i++)); do
  kit_group_alive "$pid" || break
  sleep 0.5
done
kill -KILL -- "-$pid" 2>/dev/null || true
for p in "${family[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
for ((i = 0; i < 20; i++)); do
  kit_group_alive "$pid" || break
  sleep 0.25
done
rm -f -- "$PID_FILE"
printf 'stopped vLLM (process group %s)\n' "$pid"
'''

SMOKE = r'''#!/usr/bin/env bash
# Is the deployed server what was tuned? Health, the model list, one completion, then a short load at
# SMOKE_LOAD (default: 80 % of the trial's measured capacity) that must meet the study's SLO: three
# closed-loop waves (SMOKE_REQUESTS) after one unmeasured wave (SMOKE_WARMUP), the study's workload.
# SMOKE_SLO (default: the study's SLO) is the bound checked, e.g. looser on a host slower than the tuned one.
set -euo pipefail
KIT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
. "$KIT_DIR/settings.sh"
kit_command
kit_setting SMOKE_LOAD "$LOAD_KIND"
kit_setting SMOKE_REQUESTS int
kit_setting SMOKE_WARMUP int
kit_setting SMOKE_SLO text
kit_setting PYTHON text
BASE="http://$CLIENT_HOST:$PORT"
fail() { printf 'smoke: FAILED: %s\n' "$*" >&2; exit 1; }
get() { curl -fsS --noproxy '*' --max-time 30 "$@"; }

echo "smoke: /health"
get -o /dev/null "$BASE/health" || fail "$BASE/health does not answer"

echo "smoke: /v1/models serves $SERVED"
models="$(get "$BASE/v1/models")" || fail "$BASE/v1/models does not answer"
"$PYTHON" -c 'import json, sys
ids = [m["id"] for m in json.loads(sys.stdin.read())["data"]]
sys.exit(0 if sys.argv[1] in ids else "served models are %s" % ids)' "$SERVED" <<<"$models" || fail "model not served"

echo "smoke: one completion"
payload="$("$PYTHON" -c 'import json, sys
print(json.dumps({"model": sys.argv[1], "prompt": "The capital of France is", "max_tokens": 8}))' "$SERVED")"
answer="$(get -H 'Content-Type: application/json' -d "$payload" "$BASE/v1/completions")" \
  || fail "completion request failed"
"$PYTHON" -c 'import json, sys
a = json.loads(sys.stdin.read())
ok = isinstance(a["choices"][0]["text"], str) and a["usage"]["completion_tokens"] > 0
sys.exit(0 if ok else "no tokens generated: %s" % a)' <<<"$answer" || fail "bad completion"

printf 'smoke: %s requests at %s %s (measured capacity %s; SLO %s)\n' \
  "$SMOKE_REQUESTS" "$LOAD_FLAG" "$SMOKE_LOAD" "$CAPACITY" "$SMOKE_SLO"
"$PYTHON" -m autotune bench --url "$BASE" --model "$SERVED" --workload "$WORKLOAD" \
  "--$LOAD_FLAG" "$SMOKE_LOAD" --num-requests "$SMOKE_REQUESTS" --warmup "$SMOKE_WARMUP" \
  --slo "$SMOKE_SLO" --check-slo \
  || fail "the SLO was not met at $LOAD_FLAG $SMOKE_LOAD"
echo "smoke: passed"
'''
