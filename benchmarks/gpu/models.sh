# Sourced by the device scripts (round2/device.sh, confirm/device.sh): the background model writer and
# the wait for it. The writer runs from a copy in /tmp because each device call replaces the working
# tree (round 2 lost 240 s to a script that had vanished under the background writer).

write_models() {   # write_models "CMD && CMD": the writer's commands, run with the copied sources
  mkdir -p /tmp/models /tmp/msrc && cp -r autotune benchmarks/gpu/make_model.py benchmarks/gpu/round2/make_moe.py /tmp/msrc/
  PYTHONPATH=/tmp/msrc setsid nohup bash -c "$1 && touch /tmp/models/.ready" > /tmp/models/make.log 2>&1 < /dev/null &
  echo $! > /tmp/models/writer.pid
  echo "model writer started (pid $!)"
}

wait_models() {   # until the models are written; fails at once if the writer died without finishing
  for _ in $(seq 150); do
    [ -f /tmp/models/.ready ] && break
    kill -0 "$(cat /tmp/models/writer.pid 2>/dev/null)" 2>/dev/null || break
    sleep 2
  done
  cat /tmp/models/make.log
  [ -f /tmp/models/.ready ] || { echo "models not ready"; exit 1; }
}

left() {   # seconds this device call has left (T0: its start, LIMIT: its limit)
  echo $(( LIMIT - ($(date +%s) - T0) ))
}
