"""Failure causes: the words a person reads in `show`, the store and exports (DESIGN.md keeps the list)."""

STARTUP_OOM = "startup_oom"          # memory utilization above what the device/node has free, or weights do not fit
KV_TOO_SMALL = "kv_too_small"        # KV cache cannot hold one max-model-len request
RUNTIME_OOM = "runtime_oom"          # started, then ran out of memory under load
BAD_FLAG = "bad_flag"                # argparse rejected a flag (unknown name, value of the wrong type)
BAD_CONFIG = "bad_config"            # every flag parsed, but vLLM rejected the combination at start (its config checks)
STARTUP_TIMEOUT = "startup_timeout"  # not ready within the startup timeout (hang)
CRASH = "crash"                      # exited for another reason
PREDICTED_OOM = "predicted_oom"      # the memory model says it cannot start: never launched
INTERRUPTED = "interrupted"          # Ctrl-C / SIGTERM of autotune during the trial
CLIENT_SATURATED = "client_saturated"  # the load generator itself was the bottleneck
CONSTRAINT = "constraint"            # broke a known constraint between parameters: never launched
EARLY_STOPPED = "early_stopped"      # capacity search ended once the front dominated its bound (never exported)
WORKER_DIED = "worker_died"          # the measurement worker process died (killed, out of memory): re-queued

ALL = (STARTUP_OOM, KV_TOO_SMALL, RUNTIME_OOM, BAD_FLAG, BAD_CONFIG, STARTUP_TIMEOUT, CRASH, PREDICTED_OOM,
       INTERRUPTED, CLIENT_SATURATED, CONSTRAINT, EARLY_STOPPED, WORKER_DIED)
