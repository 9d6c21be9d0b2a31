"""Traces: the canonical request-log format (format.py), the log readers `autotune convert` uses
(openai_log, sharegpt, csv_log), turn linking, cutting (window, sample), `--lengths-only` (private.py)
and the shared-prefix index. The replay itself is a workload (workloads/_trace.py) and an arrival
process (arrivals/_trace.py)."""
