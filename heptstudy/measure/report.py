"""The JSON report of one measurement run: a versioned, validated schema. Every report
carries :data:`PROTOCOL`, the written measurement definitions, so a file explains its own numbers.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import socket
import sys
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_serializer,
    model_validator,
)

from heptstudy.atomic import Output, atomic_write_text, json_text, write_text_or_keep
from heptstudy.data.layout import BATCHINGS, BatchGeometry, is_packed
from heptstudy.errors import HeptstudyError, describe_invalid
from heptstudy.meters.allocator import allocator_in_use
from heptstudy.model.checkpoint_plan import CheckpointPlan, plan_named
from heptstudy.paths import git

SCHEMA_VERSION = "heptstudy.bench/1"
#: The kind of a paired timing (``heptstudy bench paired``): a report of its own, no bench report.
PAIRED_KIND = "paired_timing"
#: A report replaces only a report (the schema is the first line of every one written).
REPORT_FILE = Output(
    "heptstudy bench report", ".json", f'"schema_version": "{SCHEMA_VERSION}"'.encode()
)

PROTOCOL = """\
heptstudy measurement protocol (schema heptstudy.bench/1)

Step. One training step = forward pass + loss (real Hungarian matching, auxiliary decoder and
grouping losses) + backward + optimizer update (LAMB) + learning-rate scheduler step, on one
batch already resident on the device.

Time. Wall clock (time.perf_counter) around the step with the device synchronised before the
clock starts and before it stops (torch.cuda.synchronize on CUDA/ROCm). Excluded: input loading
and host-to-device transfer (batches are on the device before the clock starts), host-side
checks, validation, report writing. The first `warmup` steps are run and recorded but not
counted (default: 2 warm-up and 5 counted steps on CUDA/ROCm, 1 and 2 on CPU); the summary time is
the mean of the counted steps (std and min also given). On CPU, times come from steps run without
the memory tracker (it slows every op down); memory comes from tracked steps over the same batches.

Step-time breakdown. Each timed step is split into backbone forward (input encoding, hashing,
backbone layers), decoder and heads, loss (with the Hungarian matching on the host), backward and
optimizer (LAMB, scheduler, clearing gradients), without any added synchronisation: on CPU the
wall clock at the phase boundaries, on CUDA/ROCm events recorded on the stream at the boundaries.
The summary gives the mean of each phase over the counted steps.

Host. On CPU the allocator a process starts with changes step times: glibc as it comes hands large
freed blocks back to the kernel, which maps and zeroes their pages again on every step. Each report
records the allocator and its settings (environment.allocator, environment.allocator_settings).
A measurement applies its platform's settings itself, with glibc's mallopt at its start, whether
it runs under heptstudy bench, a notebook or a study (environment.allocator_applied: the values
applied; local_cpu, also on a CPU without a platform, keeps freed memory: MALLOC_MMAP_THRESHOLD_
and MALLOC_TRIM_THRESHOLD_ 16 GiB, applied as 2 GiB - 1, mallopt's largest, and MALLOC_TOP_PAD_
1 GiB; after the warm-up the timed pass grows the heap's free top to the pad and maps every page
of the heap, madvise MADV_POPULATE_WRITE, so that no counted step faults in memory the allocator
already holds); allocator: default applies nothing and records the settings the process started
with; and for each timed step the process's minor and major page faults and system and user CPU
time (resource.getrusage around the step). A memory measurement runs both passes, or only the timing
or only the memory pass (summary.tracked_memory_note says which).

Memory. The peak over forward, loss and backward of each step (not step-end occupancy); the
summary is the maximum over counted steps, in MiB (2^20 bytes).
- CUDA and ROCm: torch.cuda.reset_peak_memory_stats before the step, then
  torch.cuda.max_memory_allocated ("allocated") and torch.cuda.max_memory_reserved ("reserved",
  the caching allocator's segments) after it, with the device synchronised.
- CPU (PyTorch keeps no allocator statistics): "allocated" is the peak of live tensor-storage
  bytes, tracked by a TorchDispatchMode that sees every ATen op below autograd (including backward
  and the recomputation of checkpointed layers) and counts each new storage once until it is
  freed, on top of the storages alive at the start (parameters, buffers, gradients, optimizer
  state, batch). Not seen: scratch buffers a kernel allocates and frees internally, non-tensor
  memory. "Reserved" is the peak resident set of the whole process over the step (VmHWM from
  /proc/self/status after writing 5 to /proc/self/clear_refs); null, with the reason, where /proc
  is unavailable.

Comparisons. The same batch size uses the same event indices and the same initialisation seed with
checkpointing on and off. Each configuration is meant to run in a fresh process;
environment.fresh_process records whether it did. A study (heptstudy study run) times the
compared plans in paired rounds in one process (each plan's step between two off steps on the same
batch), or in rounds of fresh processes, one after the other inside a round (a matrix's repeats),
and gives each overhead as the median and range over the rounds.

Data. data.synthetic says whether the events come from the generated (synthetic) data set or a
real one; batches are real events of the data set, never truncated or made up on the fly.

Parity. Repeated passes without optimizer updates on the same batch and initialisation: baseline,
baseline repeat, checkpointed. Outputs and loss: exactly equal or not, max |difference|.
Gradients: relative L2 norm of the difference and max |difference|, checkpointed-vs-baseline next
to repeat-vs-baseline.
"""


#: Sizes, times and counts: a negative one is a damaged or hand-edited report, never a result.
NonNegative = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0)]


class ReportError(HeptstudyError, ValueError):
    """A report file could not be read or does not follow the schema."""


class _Strict(BaseModel):
    # NaN and the infinities are not JSON: no field of a report holds one
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OomInfo(_Strict):
    """What did not fit: an out-of-memory is a result of the study, not a crash."""

    message: str
    step: Count | None = None
    # where it ran out: the bench pass and the step phase, e.g. "memory pass: backward",
    # "timing pass: backbone_forward", "validation"
    phase: str | None = None
    batch_size: int = Field(ge=1)
    padded_hits: list[Count]  # per event of the batch that did not fit
    padded_batch_hits: Count | None = None  # batch_size x longest padded event
    device_memory_bytes: Count | None = None


class AttentionInfo(_Strict):
    """The HEPTv2 bucket attention of a run (:func:`heptstudy.model.flex_kernel.attention_status`);
    ``fused-reference`` is flex_attention's dense CPU implementation. Counts are per process."""

    backend_used: Literal["fused", "fused-reference", "plain", "none"]
    configured: str | None = None  # model.heptv2.attention_backend
    fused_calls: int = 0
    fused_compiles: int = 0
    fused_compiler: str | None = None  # torch.compile backend: inductor (CUDA), eager (CPU)
    fused_shape_policy: str | None = None  # dynamic or ladder
    fused_kernel_lengths: int = 0


class Environment(_Strict):
    platform: str | None  # platform profile name, e.g. "lumi_mi250x"; None for ad-hoc runs
    device_kind: Literal["cpu", "cuda", "rocm", "mps", "meta", "other"]
    device_name: str
    device_count: int | None = None
    dtype: str
    threads: int = Field(ge=1)
    torch_version: str
    git_commit: str | None
    git_dirty: bool | None = None
    hostname: str
    python: str
    fresh_process: bool
    # clearly above ``threads`` at the end: other work competed and times are unreliable
    load_average_1min: float | None = None
    attention: AttentionInfo | None = None
    # heptstudy.meters.allocator; allocator_applied None: the start environment's settings
    allocator: str | None = None
    allocator_settings: dict[str, str] | None = None
    allocator_applied: dict[str, int] | None = None


class DataInfo(_Strict):
    dataset: str
    data_dir: str | None
    synthetic: bool
    split: str
    configs: list[str] | None = None  # builder configs read as shards, e.g. ["1"]


class Checkpointing(_Strict):
    # model.heptv2.activation_checkpointing; None in a parity report (off against full)
    plan: str | None = None
    memory_budget_mib: NonNegative | None = None  # auto only: what each step's plan must fit
    #: solver plans (keepNN) only: the op groups each layer kind kept, as the solver chose them
    #: on model.heptv2.op_costs (heptstudy.model.solver)
    keep: dict[str, list[str]] | None = None

    @model_serializer(mode="wrap")
    def _keep_only_when_kept(self, handler) -> dict[str, Any]:
        # reports of the other plans stay as they were written before the field existed
        data = handler(self)
        if self.keep is None:
            data.pop("keep", None)
        return data


class StepRecord(_Strict):
    step: Count
    counted: bool
    event_indices: list[Count]
    hits: list[Count]
    padded_hits: list[Count]
    geometry: BatchGeometry | None = None  # None only for a step that ran no batch
    time_s: NonNegative | None
    peak_allocated_mib: NonNegative | None
    peak_reserved_mib: NonNegative | None
    loss: dict[str, float] = Field(default_factory=dict)
    # activation_checkpointing=auto: the plan this step ran and its predicted peak
    checkpoint_plan: str | None = None
    predicted_peak_mib: NonNegative | None = None
    phase_time_s: dict[str, NonNegative] | None = None
    # whole process, around the timed step (heptstudy.meters.host_usage)
    minor_page_faults: Count | None = None
    major_page_faults: Count | None = None
    system_time_s: NonNegative | None = None
    user_time_s: NonNegative | None = None


class Summary(_Strict):
    counted_steps: Count
    warmup_steps: Count
    mean_step_time_s: NonNegative | None
    std_step_time_s: NonNegative | None = None
    min_step_time_s: NonNegative | None = None
    max_peak_allocated_mib: NonNegative | None
    max_peak_reserved_mib: NonNegative | None
    allocated_definition: str | None = None
    reserved_definition: str | None = None
    reserved_unavailable_reason: str | None = None
    tracked_memory_note: str | None = None
    mean_phase_time_s: dict[str, NonNegative] | None = None
    phase_time_definition: str | None = None


class TensorComparison(_Strict):
    name: str
    equal: bool
    max_abs_diff: float
    shape: list[int] | None = None


class GradientComparison(_Strict):
    name: str
    rel_l2: float
    max_abs_diff: float
    equal: bool | None = None


class ComparisonSet(_Strict):
    outputs: list[TensorComparison]
    loss: TensorComparison
    gradients: list[GradientComparison]
    num_outputs: int
    num_gradients: int
    # relative L2 norm of the difference of all gradients together; every loss component
    overall_rel_l2: float | None = None
    loss_components: list[TensorComparison] | None = None

    @model_validator(mode="after")
    def _counts(self) -> ComparisonSet:
        if self.num_outputs != len(self.outputs) or self.num_gradients != len(self.gradients):
            raise ValueError(
                f"num_outputs/num_gradients ({self.num_outputs}/{self.num_gradients}) do not match "
                f"the lists ({len(self.outputs)}/{len(self.gradients)})"
            )
        return self


class Parity(_Strict):
    checkpointed_vs_baseline: ComparisonSet
    repeat_vs_baseline: ComparisonSet
    deterministic: bool
    #: a few optimizer steps' losses per mode, e.g. {"baseline": [...], "checkpointed": [...]}
    loss_trajectories: dict[str, list[float]] = Field(default_factory=dict)


class MemoryCategories(_Strict):
    """Live bytes by category at the peak of one step, and the step's memory timeline."""

    step: Count
    peak_bytes: Count
    at_peak_bytes: dict[str, Count]
    note: str
    #: The same bytes by owner, then category (``StepMemory.by_module_at_peak``).
    by_module_bytes: dict[str, dict[str, int]] | None = None
    timeline: list[tuple[int, int]] | None = None  # (op index, live bytes)
    marks: list[tuple[int, str]] = Field(default_factory=list)  # (op index, label)


class BenchReport(_Strict):
    schema_version: Literal["heptstudy.bench/1"] = SCHEMA_VERSION
    kind: Literal["memory", "parity"]
    status: Literal["ok", "oom", "error"]
    name: str | None = None  # e.g. "checkpointed_b16"
    created_at: str = Field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    error: str | None = None
    oom: OomInfo | None = None
    protocol: str = PROTOCOL
    environment: Environment
    data: DataInfo
    config: dict[str, Any]
    batch_size: int = Field(ge=1)
    #: the geometry of the batch of the highest counted peak (else the first step's)
    geometry: BatchGeometry | None = None
    checkpointing: Checkpointing
    steps: list[StepRecord] = Field(default_factory=list)
    summary: Summary | None = None
    validation: dict[str, float] | None = None
    parity: Parity | None = None
    memory_categories: list[MemoryCategories] | None = None
    notes: list[str] = Field(default_factory=list)
    # a study resumes the run only while this is unchanged (heptstudy.study.resume)
    fingerprint: str | None = None

    @property
    def packed(self) -> bool:
        """Whether its batches were packed (a run that stopped before any step: as configured)."""
        if self.geometry is not None:
            return self.geometry.packed
        return is_packed((self.config.get("data") or {}).get("batching", ""))

    @property
    def plan(self) -> CheckpointPlan:
        """The checkpointing plan measured (off in a parity report)."""
        layers = self.config.get("model", {}).get("heptv2", {}).get("num_convs")
        return plan_named(self.checkpointing.plan or "off", layers)

    @model_validator(mode="before")
    @classmethod
    def _geometry(cls, data: Any) -> Any:
        """Reports written before the geometry was a field: from each step's padded hits and
        the configured batching."""
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            return data
        config = data.get("config")
        data_config = config.get("data") if isinstance(config, dict) else None
        batching = (data_config or {}).get("batching", BATCHINGS[0])
        steps = []
        for st in data["steps"]:
            if isinstance(st, dict) and "geometry" not in st and st.get("padded_hits"):
                st = {**st, "geometry": BatchGeometry.of_events(st["padded_hits"], batching)}
            steps.append(st)
        return {**data, "steps": steps}

    @model_validator(mode="after")
    def _peak_geometry(self) -> BenchReport:
        if self.geometry is None:
            steps = [st for st in self.steps if st.geometry is not None]
            peak = max(
                (st for st in steps if st.counted and st.peak_allocated_mib is not None),
                key=lambda st: st.peak_allocated_mib,
                default=steps[0] if steps else None,
            )
            self.geometry = None if peak is None else peak.geometry
        return self

    @model_validator(mode="after")
    def _status_details(self) -> BenchReport:
        if self.status == "oom" and self.oom is None:
            raise ValueError("status is 'oom' but the 'oom' details (what did not fit) are missing")
        if self.status == "error" and not self.error:
            raise ValueError("status is 'error' but the 'error' message is missing")
        if self.status == "ok" and self.kind == "parity" and self.parity is None:
            raise ValueError("a parity report with status 'ok' needs the 'parity' results")
        if self.status == "ok" and self.kind == "memory" and self.summary is None:
            raise ValueError("a memory report with status 'ok' needs the 'summary'")
        return self


def short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_report(data: BenchReport | dict[str, Any], source: str = "<report>") -> BenchReport:
    if isinstance(data, BenchReport):
        data = data.model_dump(mode="python")
    if not isinstance(data, dict):
        raise ReportError(f"{source}: a report must be a JSON object, got {type(data).__name__}")
    if data.get("kind") == PAIRED_KIND:
        raise ReportError(
            f"{source}: a paired timing (`heptstudy bench paired`: plans' step-time overheads "
            "against off), not a bench report; give the bench reports of the runs, e.g. the "
            "memory reports of the study folder above its paired/"
        )
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        what = "is missing" if "schema_version" not in data else f"is {version!r}"
        raise ReportError(
            f"{source}: schema_version {what}; this heptstudy reads {SCHEMA_VERSION!r} only. "
            "Regenerate the report with this version of heptstudy (`heptstudy bench ...`)."
        )
    try:
        return BenchReport.model_validate(data)
    except ValidationError as err:
        raise ReportError(
            describe_invalid(
                err,
                noun="field",
                header=f"{source}: not a valid heptstudy report (schema {SCHEMA_VERSION}):",
                footer="regenerate the report with `heptstudy bench` or fix the field named above",
                show=short_repr,
            )
        ) from None


def write_report(
    report: BenchReport | dict[str, Any], path: str | os.PathLike, *, keep: bool = False
) -> Path:
    """Validate, then write atomically; with ``keep``, a report the disk refuses is kept
    elsewhere and :class:`~heptstudy.atomic.WriteFailed` says where."""
    if isinstance(report, dict):  # one written here may leave the version out
        report = {"schema_version": SCHEMA_VERSION, **report}
    report = validate_report(report, source=str(path))
    text = json_text(report.model_dump(), f"the report {path}")
    if keep:
        return write_text_or_keep(path, text, f"the report {Path(path).name}", kind=REPORT_FILE)
    return atomic_write_text(path, text, kind=REPORT_FILE)


def _not_json(path: Path, word: str):
    # Python's reader takes NaN and Infinity, which are not JSON and no measured value
    raise ReportError(
        f"{path}: holds {word}, which is not a JSON number and no measured value; regenerate "
        "the report with `heptstudy bench`"
    )


def read_report(path: str | os.PathLike) -> BenchReport:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the report ({exc.strerror or exc})") from None
    try:
        data = json.loads(text, parse_constant=partial(_not_json, path))
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "the file may be truncated: regenerate it with `heptstudy bench`"
        ) from None
    return validate_report(data, source=str(path))


def git_dirty(repo_dir: str | os.PathLike | None = None) -> bool | None:
    """Whether tracked code differs from the commit (None: unknown); results do not count: a
    study rewrites them as it runs."""
    out = git(
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ":(top)",
        ":(top,exclude)experiments",
        ":(top,exclude)figures",
        cwd=repo_dir,
    )
    return None if out is None else bool(out.strip())


def load_average() -> float | None:
    """The 1-minute load average; None where the platform keeps none."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


_CLAIMS = itertools.count()


def claim_fresh_process() -> bool:
    """True the first time a measurement asks in this process, False afterwards."""
    return next(_CLAIMS) == 0


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine() or "cpu"
    return str(device)


def environment_info(
    device: torch.device | str,
    dtype: torch.dtype | str,
    platform_name: str | None,
    fresh_process: bool | None = None,
    allocator=None,
) -> Environment:
    """Call once per measurement: ``fresh_process`` defaults to :func:`claim_fresh_process`."""
    device = torch.device(device)
    gpu_kind = "rocm" if torch.version.hip else "cuda"
    allocator = allocator if allocator is not None else allocator_in_use()
    return Environment(
        platform=platform_name,
        device_kind=gpu_kind if device.type == "cuda" else device.type,
        device_name=device_name(device),
        device_count=torch.cuda.device_count() if device.type == "cuda" else None,
        dtype=str(dtype).removeprefix("torch."),
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        git_commit=(git("rev-parse", "HEAD") or "").strip() or None,
        git_dirty=git_dirty(),
        hostname=socket.gethostname(),
        python=sys.version.split()[0],
        fresh_process=claim_fresh_process() if fresh_process is None else fresh_process,
        allocator=allocator.name,
        allocator_settings=dict(allocator.settings),
        allocator_applied=None if allocator.applied is None else dict(allocator.applied),
    )
