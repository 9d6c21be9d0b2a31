"""Engines start OpenAI-compatible servers as processes (DESIGN.md principle 1: vLLM is never imported).

`base` holds the interface; `vllm` a real vLLM server; `process` the process-group hygiene every
engine shares; `logparse` what vLLM's log says about startup and failure.
"""

from autotune.engine.base import Engine, EngineFailure, LaunchRequest, Server, StartupInfo
from autotune.engine.logparse import classify_failure, parse_startup
from autotune.engine.process import (
    ProcessRecord,
    find_free_port,
    kill_leftovers,
    record_of,
    stop_group,
    wait_port_free,
)
from autotune.engine.vllm import VLLMEngine, VLLMServer

__all__ = [
    "Engine",
    "EngineFailure",
    "LaunchRequest",
    "ProcessRecord",
    "Server",
    "StartupInfo",
    "VLLMEngine",
    "VLLMServer",
    "classify_failure",
    "find_free_port",
    "kill_leftovers",
    "parse_startup",
    "record_of",
    "stop_group",
    "wait_port_free",
]
