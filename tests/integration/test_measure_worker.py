"""A trial's measurement in its worker process (tuner/measure.py) against the mock server (real HTTP on
loopback, a batch model of known capacity): the phase lines and the measurement come back; an interrupt
after the search's last step keeps the measurement; one while steps remain stops the worker and arrives
as Interrupted. The interrupt is sent from the phase line that reports a step, so which step it follows
is certain."""

from __future__ import annotations

import threading

import pytest

from autotune.node.interrupts import Gate, Interrupted, interruptible, set_gate
from autotune.node.worker import Worker
from autotune.tuner.measure import TARGET, MeasureRequest, TelemetryRequest, measure


def _request(url: str, tmp_path, max_steps: int) -> MeasureRequest:
    return MeasureRequest(url=url, model="mock", workload={"kind": "random", "input_len": 20, "output_len": 16},
                          slo="tpot:p50<=12.125ms", seed=0, log_path=str(tmp_path / "server.log"),
                          load={"mode": "capacity", "search": "concurrency", "max_steps": max_steps,
                                "requests_per_step": 20, "warmup": 2, "refine_steps": 0, "min_waves": 1},
                          telemetry=TelemetryRequest(source="none", hz=5))


def _run(request: MeasureRequest, interrupt_at_step: int | None) -> tuple[list[str], object]:
    """measure() in a job-like thread with a gate; the gate is interrupted when the phase line of step
    `interrupt_at_step` (1-based) arrives. Returns the phase lines and the result (or the Interrupted)."""
    lines: list[str] = []
    box: dict[str, object] = {}
    gate = Gate()
    worker = Worker(TARGET).start()

    def phase(text: str) -> None:
        lines.append(text)
        if interrupt_at_step is not None and sum("capacity search: concurrency" in x for x in lines) == interrupt_at_step:
            gate.interrupt("timeout")

    def job() -> None:
        set_gate(gate)
        try:
            with interruptible():
                box["result"] = measure(worker, request, phase)
        except Interrupted as e:
            box["result"] = e
        finally:
            set_gate(None)

    t = threading.Thread(target=job)
    t.start()
    t.join(240)
    worker.close()
    assert not t.is_alive(), lines
    return lines, box["result"]


def test_the_measurement_comes_back_with_its_phase_lines_and_the_clients_cpu(mock_in_thread: str, tmp_path) -> None:
    lines, got = _run(_request(mock_in_thread, tmp_path, 3), None)
    assert lines[0] == "capacity search by concurrency" and all(x.startswith("capacity search") for x in lines)
    assert got.kind == "measured" and got.error is None and got.capacity["capacity"] is not None
    assert len(got.capacity["steps"]) == 3 and got.measurement["records"]
    assert got.telemetry["source"] == "none" and got.client.cpu_s > 0 and got.client.wall_s > 0


def test_an_interrupt_after_the_last_step_keeps_the_measurement(mock_in_thread: str, tmp_path) -> None:
    lines, got = _run(_request(mock_in_thread, tmp_path, 2), interrupt_at_step=2)
    assert not isinstance(got, Interrupted), lines
    assert got.kind == "measured" and len(got.capacity["steps"]) == 2


def test_an_interrupt_while_steps_remain_stops_the_worker(mock_in_thread: str, tmp_path) -> None:
    lines, got = _run(_request(mock_in_thread, tmp_path, 6), interrupt_at_step=1)
    assert isinstance(got, Interrupted) and got.reason == "timeout", lines
    assert sum("capacity search: concurrency" in x for x in lines) <= 2   # the step running then, at most


class _Channel:
    """The worker's pipe, in this process: records what is sent; `on_phase` sees each phase line."""

    def __init__(self, on_phase) -> None:
        self.sent: list = []
        self.on_phase = on_phase

    def send(self, message) -> None:
        self.sent.append(message)
        if message.kind == "phase":
            self.on_phase([m.text for m in self.sent if m.kind == "phase"])

    def recv(self) -> dict:
        raise EOFError


@pytest.mark.parametrize("max_steps, stop_at, kept", [(2, 2, True), (4, 1, False)])
def test_the_workers_rule_for_a_stop_that_comes_as_a_step_reports(mock_in_thread: str, tmp_path, max_steps: int,
                                                                  stop_at: int, kept: bool) -> None:
    """The worker's measurement run here, the stop delivered from inside the step's report (as if the
    parent's message arrived at that instant): after the last step the search is kept; after an earlier
    step the next step never runs and the measurement is Interrupted."""
    from autotune.tuner.measure import _Run

    def on_phase(lines: list[str]) -> None:
        if sum("capacity search: concurrency" in x for x in lines) == stop_at:
            run.request_stop("timeout")

    channel = _Channel(on_phase)
    run = _Run(_request(mock_in_thread, tmp_path, max_steps), channel)
    if kept:
        got = run.measure()
        assert got.kind == "measured" and len(got.capacity["steps"]) == max_steps
    else:
        with pytest.raises(Interrupted):
            run.measure()
        steps = [m for m in channel.sent if m.kind == "phase" and "capacity search: concurrency" in m.text]
        assert len(steps) == stop_at
