"""autotune: relaunch vLLM with candidate flags, measure under a latency SLO, let Optuna choose."""

__version__ = "0.1.0"
