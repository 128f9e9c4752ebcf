"""Platform profiles: hardware and runtime settings, the allocator's among them."""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from heptstudy.config.plans import PlanOrder
from heptstudy.config.strict import StrictInput
from heptstudy.names import check_name

#: The settings of PyTorch's caching allocator (its CUDA, HIP and device-neutral variables).
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _whole(value: str, low: int = 0) -> bool:
    return re.fullmatch(r"[0-9]+", value) is not None and int(value) >= low


def _power_of_2(value: str, zero: bool = False) -> bool:
    return _whole(value) and (not int(value) & (int(value) - 1)) and (zero or int(value) > 0)


def _roundup(value: str) -> bool:
    if not (value.startswith("[") and value.endswith("]")):
        return _power_of_2(value)
    pairs = [item.partition(":") for item in value[1:-1].split(",")]
    return all(
        sep and (size.strip() == ">" or _power_of_2(size.strip())) and _power_of_2(d.strip(), True)
        for size, sep, d in pairs
    )


_TRUE_FALSE = ("True or False", lambda v: v in ("True", "False"))
#: Option -> (what its value must be, the check), as PyTorch's allocator documents and parses
#: them: PyTorch refuses a wrong one only when the job starts on the GPU, after its queue wait.
ALLOC_OPTIONS = {
    "backend": ("native or cudaMallocAsync", lambda v: v in ("native", "cudaMallocAsync")),
    "max_split_size_mb": ("a whole number of MiB above 20", lambda v: _whole(v, 21)),
    "max_non_split_rounding_mb": ("a whole number of MiB", _whole),
    "roundup_power2_divisions": (
        "a power of 2, or [MIB:DIVISIONS,...,>:DIVISIONS] with MIB and DIVISIONS powers of 2 "
        "(DIVISIONS 0: no rounding)",
        _roundup,
    ),
    "garbage_collection_threshold": (
        "a number between 0 and 1 (both excluded)",
        lambda v: re.fullmatch(r"[0-9]*\.?[0-9]+", v) is not None and 0 < float(v) < 1,
    ),
    "expandable_segments": _TRUE_FALSE,
    "pinned_use_cuda_host_register": _TRUE_FALSE,
    "pinned_num_register_threads": (
        "a power of 2 up to 128",
        lambda v: _power_of_2(v) and int(v) <= 128,
    ),
    "pinned_use_background_threads": _TRUE_FALSE,
    "release_lock_on_cudamalloc": _TRUE_FALSE,
}


def check_alloc_conf(name: str, setting: str) -> None:
    """Every ``option:value`` of an allocator setting known, each value in its range."""
    for item in re.split(r",(?![^\[]*\])", setting):  # a comma inside [...] is in a value
        option, _, value = (part.strip() for part in item.partition(":"))
        if not option and not value:
            continue
        if option not in ALLOC_OPTIONS:
            near = difflib.get_close_matches(option, ALLOC_OPTIONS, n=1)
            raise ValueError(
                f"env.{name}={setting!r}: option {option!r} is unknown to PyTorch's caching "
                f"allocator{f'; did you mean {near[0]!r}?' if near else ''} (known: "
                f"{', '.join(ALLOC_OPTIONS)})"
            )
        allowed, check = ALLOC_OPTIONS[option]
        if not check(value):
            raise ValueError(
                f"env.{name}={setting!r}: {option}:{value} is not allowed: {option} must be "
                f"{allowed}"
            )


class PlatformConfig(StrictInput):
    """Hardware and runtime settings only; the science lives in the scenario."""

    name: Annotated[
        str, AfterValidator(lambda v: check_name(v, "the platform name", example="lumi_mi250x"))
    ]
    device: Literal["cpu", "cuda", "rocm"]
    devices_per_node: int = Field(ge=1)
    nodes: int = Field(1, ge=1)
    device_memory_gib: float = Field(gt=0.0)
    dtype: Literal["float32", "bfloat16"]
    attention_backend: Literal["auto", "fused", "plain"]
    torch_version: str | None = Field(
        None,
        pattern=r"^\d+\.\d+",
        description="the PyTorch version the platform runs (major.minor, e.g. 2.11): the "
        "estimate uses that version's autocast lists; None: the GPU evidence's 2.11",
    )
    launcher: Literal["local", "torchrun", "slurm"]
    cpus_per_task: int = Field(1, ge=1)
    data_workers: int = Field(
        0, ge=0, description="data.num_workers per rank unless the scenario or --set gives it"
    )
    host_memory_gib: float = Field(0.0, ge=0.0)
    time_limit: str = "48:00:00"
    partition: str = ""
    account: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    modules: list[str] = Field(default_factory=list)
    auto_plan_order: PlanOrder = Field(
        None,
        description="the order of checkpointing plans measured on this platform "
        "(heptstudy.estimate.plans.plan_order_from_reports), used by "
        "activation_checkpointing=auto unless model.heptv2.auto_plan_order is set",
    )

    @field_validator("time_limit", "partition", "account")
    @classmethod
    def _one_line(cls, value: str, info: ValidationInfo) -> str:
        # each is an '#SBATCH --KEY=VALUE' line: a line break would start a shell command
        if not value.isprintable():
            raise ValueError(
                f"{info.field_name}={value!r} must be one line of printable text (it becomes an "
                "#SBATCH directive); remove the line break or control character"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not key.isidentifier() or not key.isascii():
                raise ValueError(
                    f"env name {key!r} is not a shell variable name: letters, digits and '_', "
                    "not starting with a digit"
                )
            if "\x00" in text:
                raise ValueError(f"env {key}: a NUL character cannot be passed to a shell")
            if key in ALLOC_CONF_VARS:
                check_alloc_conf(key, text)
        return value

    @model_validator(mode="after")
    def _workers_leave_a_core(self) -> PlatformConfig:
        if self.launcher == "slurm":
            per_rank = self.cpus_per_task // self.devices_per_node
            if self.data_workers and self.data_workers >= per_rank:
                raise ValueError(
                    f"data_workers={self.data_workers} reader threads per rank leave no core for "
                    f"the training loop: cpus_per_task={self.cpus_per_task} over "
                    f"{self.devices_per_node} devices is {per_rank} per rank; use at most "
                    f"{max(per_rank - 1, 0)}"
                )
        return self

    @property
    def world_size(self) -> int:
        return self.devices_per_node * self.nodes
