"""The node layer: the GPU pool and its leases, heartbeats, interrupts, the scheduler and the worker
processes that measure each trial. Below both front ends (`run`, `daemon`); it knows jobs, not studies
(docs/SCHEDULER.md, "The node layer"), and imports nothing from `tuner/` or `daemon/`."""
