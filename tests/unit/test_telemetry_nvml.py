"""The `nvml` source against autotune.telemetry.mock_nvml: GPU subsets, refused fields, lifecycle."""

from __future__ import annotations

import pytest

import autotune.telemetry as telemetry
import autotune.telemetry.nvml as nvml_mod
from autotune.errors import UserError
from autotune.telemetry import TelemetryTarget
from autotune.telemetry.mock_nvml import MockGpu, MockNvml


@pytest.fixture
def nv(monkeypatch: pytest.MonkeyPatch) -> MockNvml:
    mock = MockNvml([
        MockGpu(power_w=70.0, mem_used_mib=500.0),
        MockGpu(power_w=300.0, mem_used_mib=60_000.0, mem_total_mib=81_559.0, util_pct=90.0, temp_c=70.0,
                throttle=0x4),
        MockGpu(power_w=71.0, mem_used_mib=99_000.0),                  # fullest card, but not watched
        MockGpu(power_w=500.0, mem_used_mib=70_000.0, util_pct=50.0, temp_c=60.0, throttle=0x1),
    ])
    monkeypatch.setattr(nvml_mod, "import_pynvml", lambda: mock)
    return mock


def run(nv: MockNvml, gpus: list[int], wait_until, samples: int = 20, hz: float = 50.0) -> telemetry.TelemetrySummary:
    """Sample `gpus` until `samples` samples are taken (however long a busy machine makes that)."""
    sampler = telemetry.get_source("nvml").sampler(TelemetryTarget(gpus=gpus), hz=hz)
    sampler.start()
    wait_until(lambda: sampler.series.seen >= samples, what=f"{samples} samples")
    return sampler.stop()


def test_reads_only_the_trials_gpus_and_combines_them(nv: MockNvml, monkeypatch: pytest.MonkeyPatch,
                                                      wait_until) -> None:
    counter: dict[int, list[float]] = {}            # each card's energy reads: when (the mock's clock)
    real = nv.nvmlDeviceGetTotalEnergyConsumption

    def energy(g: MockGpu) -> int:
        value = real(g)
        counter.setdefault(nv.gpus.index(g), []).append(g._t)
        return value
    monkeypatch.setattr(nv, "nvmlDeviceGetTotalEnergyConsumption", energy)
    s = run(nv, [1, 3], wait_until)
    assert nv.gpus[0].reads == 0 and nv.gpus[2].reads == 0
    assert nv.gpus[1].reads > 0 and nv.gpus[3].reads > 0
    assert s.gpus == [1, 3]
    assert s.mean_power_w == pytest.approx(800.0)                     # power adds up over the trial's cards
    assert s.mean_util_pct == pytest.approx(70.0)                     # utilisation is averaged
    assert s.max_temp_c == 70.0                                       # the hottest card
    # memory: the card closest to full by fraction (60000/81559 > 70000/143771), with its own total
    assert (s.peak_mem_used_mib, s.mem_total_mib) == (60_000.0, 81_559.0)
    assert s.mem_headroom == pytest.approx(1 - 60_000 / 81_559)
    assert s.throttle_reasons == ["sw_power_cap"]                     # gpu_idle is not a reason to show
    # energy: each card's counter from its first read to its last, added (300 W and 500 W over those
    # spans); its window is the samples' span
    assert s.energy_method == "counter"
    assert s.energy_j == pytest.approx(sum(w * (counter[i][-1] - counter[i][0]) for i, w in ((1, 300.0), (3, 500.0))),
                                       abs=0.01)
    assert s.energy_window_s == pytest.approx(s.series[-1]["t"] - s.series[0]["t"], abs=0.002)
    assert s.series[0]["gpu_power_w"] == [300.0, 500.0]
    assert s.unsupported == []


def test_refused_field_is_named_dropped_and_energy_falls_back_to_power(nv: MockNvml, wait_until) -> None:
    nv.gpus[3].unsupported = {"energy_mj", "throttle"}
    s = run(nv, [1, 3], wait_until)
    assert s.unsupported == ["energy_mj@gpu3", "throttle@gpu3"]
    assert s.energy_method == "power_integral"
    assert s.energy_j == pytest.approx(800.0 * s.energy_window_s, rel=0.02)
    assert all("energy_j" not in r for r in s.series)
    # asked once each, then never again: the refusing card gets 2 fewer reads per sample after the first
    per_sample_full, n = 8, s.samples
    assert nv.gpus[3].reads == per_sample_full * n - 2 * (n - 1)


def test_every_field_refused_still_gives_a_summary(nv: MockNvml, wait_until) -> None:
    nv.gpus[0].unsupported = {"power_w", "energy_mj", "util", "mem", "sm_clock_mhz", "mem_clock_mhz", "temp_c",
                              "throttle"}
    s = run(nv, [0], wait_until, samples=5)
    assert s.samples > 0 and s.mean_power_w is None and s.energy_j is None and s.mem_headroom is None
    assert len(s.unsupported) == 8
    assert telemetry.format_summary(s) == "nvml: nothing read"


def test_nvml_is_shut_down_after_stop_and_after_a_bad_index(nv: MockNvml, wait_until) -> None:
    run(nv, [0], wait_until, samples=3)
    assert nv.open_count == 0
    sampler = telemetry.get_source("nvml").sampler(TelemetryTarget(gpus=[7]))
    with pytest.raises(UserError, match="GPU 7 is not present"):
        sampler.start()
    assert nv.open_count == 0


def test_nvml_requested_without_nvml_is_one_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(nvml_mod, "import_pynvml", missing)
    with pytest.raises(UserError) as err:
        telemetry.get_source("nvml")
    assert "\n" not in str(err.value) and "nvidia-ml-py" in str(err.value)
    assert isinstance(telemetry.auto_source("vllm", [0]), telemetry.CpuSource)


def test_auto_source_choice(nv: MockNvml) -> None:
    assert isinstance(telemetry.auto_source("sim", [0]), telemetry.SimSource)
    assert isinstance(telemetry.auto_source("vllm", [0]), telemetry.NvmlSource)
    assert isinstance(telemetry.auto_source("vllm", []), telemetry.CpuSource)
    nv.gpus.clear()                                        # NVML answers but sees no GPU
    assert isinstance(telemetry.auto_source("vllm", [0]), telemetry.CpuSource)


def test_unknown_source_and_missing_target_fields_are_user_errors() -> None:
    with pytest.raises(UserError, match="unknown telemetry source 'gpu'"):
        telemetry.get_source("gpu")
    with pytest.raises(UserError):
        telemetry.NvmlSource().sampler(TelemetryTarget(gpus=[]))
    with pytest.raises(UserError):
        telemetry.CpuSource().sampler(TelemetryTarget(server_pid=None))
    with pytest.raises(UserError):
        telemetry.SimSource().sampler(TelemetryTarget(server_url=None))
