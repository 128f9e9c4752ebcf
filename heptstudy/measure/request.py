"""The one measurement request: what `heptstudy bench`, ``memory.ipynb``, ``parity.ipynb`` and a
row of a study matrix ask for, validated once, with every default stated here. Papermill hands
``-p checkpointing true`` over as the *string* ``"true"``: values are read as the configuration
reads its own (:class:`heptstudy.config.StrictInput`).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from heptstudy.config import (
    HIT_VARIANT,
    PLAN_WORDS,
    TRACK_CLUSTER_VARIANT,
    Config,
    DataConfig,
    ModelConfig,
    PlatformConfig,
    StrictInput,
    TrainConfig,
    load_config,
    load_platform,
    parse_overrides,
    parse_plan_name,
)
from heptstudy.data.layout import is_packed
from heptstudy.errors import ConfigError, describe_invalid
from heptstudy.meters.allocator import measurement_allocator
from heptstudy.model.checkpoint_plan import CheckpointPlan, plan_of, report_part
from heptstudy.paths import OUTPUT_ROOT
from heptstudy.scenario import find_platform

if TYPE_CHECKING:
    from typing import Self  # Python 3.11

#: The allowed values come from the configuration schema itself.
Variant = ModelConfig.model_fields["variant"].annotation
Dtype = TrainConfig.model_fields["dtype"].annotation
Batching = DataConfig.model_fields["batching"].annotation

MEMORY, PARITY, PAIRED = "memory", "parity", "paired"

#: Default counted and warm-up steps by device: fewer on CPU, where a step takes seconds per
#: event and every memory run executes its steps twice.
DEFAULT_STEPS = {"cpu": {"steps": 2, "warmup": 1}, "cuda": {"steps": 5, "warmup": 2}}

SCRATCH_DIR = OUTPUT_ROOT / "scratch"

DATASET_OF_VARIANT = {
    HIT_VARIANT: "cld_edm_ttbar_hits:3.2.1",
    TRACK_CLUSTER_VARIANT: "cld_edm_ttbar_pf:3.2.1",
}

#: Configuration keys that a request parameter sets: an override may not set them as well.
_OWNED_KEYS = {
    "model.heptv2.activation_checkpointing": "checkpointing",
    "train.global_batch_size": "batch_size",
    "model.variant": "variant",
    "data.data_dir": "data_dir",
    "train.dtype": "dtype",
    "train.seed": "seed",
    "data.batching": "batching",
}

#: Parameters of a memory measurement only: a parity measurement refuses them.
_MEMORY_ONLY = ("steps", "warmup", "checkpointing", "passes", "allocator")
#: Null as Python and papermill spell it, besides YAML's.
_NONE_WORDS = ("", "none", "null")


class RequestError(ConfigError):
    """A measurement parameter (command-line option, notebook parameter, matrix key) is unusable."""


def override_list(value: Any) -> list[str]:
    """Overrides as a list; one string holds several separated by whitespace (``papermill -p
    overrides "..."``). Each is read by the configuration's parser."""
    items = [] if value is None else value.split() if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ValueError(
            "allowed values are a list of KEY=VALUE strings (-y 'overrides: [train.lr=0.002]') "
            'or one string of them separated by spaces ("train.lr=0.002 model.heptv2.width=256")'
        )
    parse_overrides(items)
    return list(items)


def _owned_keys_refused(items: list[str]) -> list[str]:
    for item in items:
        key = item.split("=", 1)[0].strip()
        if key in _OWNED_KEYS:
            raise ValueError(
                f"{item!r} sets a key that has its own parameter: give "
                f"{_OWNED_KEYS[key]} instead of overriding {key}"
            )
    return items


def _platform_path(value: str | None) -> str | None:
    return None if value is None else str(find_platform(value)[1])


class Parameters(StrictInput):
    """Parameters a user gives: read as the configuration reads its values, and also as Python
    and papermill write them: None (any case, or an empty string) for null, a path object."""

    model_config = ConfigDict(validate_assignment=False)

    @model_validator(mode="before")
    @classmethod
    def _python_spellings(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        fields = cls.model_fields
        spelled = {}
        for name, value in values.items():
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            optional = name in fields and fields[name].default is None
            if optional and isinstance(value, str) and value.strip().lower() in _NONE_WORDS:
                value = None
            spelled[name] = value
        return spelled

    @classmethod
    def build(cls, spell: Callable[[str, str], str] | None = None, **values: Any) -> Self:
        """Validate ``values``; a :class:`RequestError` names every bad parameter, written by
        ``spell(field, value)`` as its user gave it (default: ``parameter field=value``)."""
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise RequestError(
                describe_invalid(
                    err,
                    noun="parameter",
                    known=sorted(cls.model_fields),
                    list_known=True,
                    spell=spell,
                )
            ) from None

    @classmethod
    def from_namespace(
        cls,
        namespace: Mapping[str, Any],
        allowed: tuple[str, ...],
        where: str,
        also: tuple[str, ...] = (),
        **fixed: Any,
    ) -> Self:
        """The ``allowed`` parameters of notebook ``where`` from its kernel's globals (``also``:
        parameters of the notebook that are not the request's). One papermill injected that the
        notebook does not have is refused: papermill only warns and runs on with the defaults,
        which measures something else than was asked."""
        # papermill's cell is the one before the running one (IPython's ``In``)
        history, injected = namespace.get("In"), set()
        cell = history[-2] if isinstance(history, list) and len(history) >= 2 else None
        if isinstance(cell, str) and cell.lstrip().startswith("# Parameters"):
            for node in ast.parse(cell).body:
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [getattr(node, "target", None)]
                )
                injected.update(t.id for t in targets if isinstance(t, ast.Name))
        known = (*allowed, *also)
        hints = [
            name + "".join(f" (did you mean {n}?)" for n in get_close_matches(name, known, n=1))
            for name in sorted(injected - set(known))
        ]
        if hints:
            raise RequestError(
                f"{where} has no parameter {', '.join(hints)}; its parameters are "
                f"{', '.join(known)}. Fix the -p/-y name and run it again"
            )
        return cls.build(**fixed, **{k: namespace[k] for k in allowed if k in namespace})


Count = Annotated[int, Field(ge=1)]
Overrides = Annotated[list[str], BeforeValidator(override_list)]
PlanName = Annotated[str, BeforeValidator(parse_plan_name)]


class MeasurementRequest(Parameters):
    """One measurement: memory and step time (``kind="memory"``) or checkpointing parity."""

    kind: Literal["memory", "parity"] = Field(
        MEMORY, description="memory (peak memory and step time) or parity (checkpointing parity)"
    )
    batch_size: Count = Field(1, description="events per step, an integer >= 1")
    batching: Batching = Field(
        "padded", description=DataConfig.model_fields["batching"].description
    )
    checkpointing: PlanName = Field(
        "off",
        description=f"activation checkpointing plan of the HEPTv2 layers (memory only): "
        f"{PLAN_WORDS} (a plan per step within model.heptv2.memory_budget_gib); true/false "
        "mean full/off",
    )
    steps: int | None = Field(
        None,
        ge=1,
        description="counted steps (memory only); None: "
        + ", ".join(f"{v['steps']} on {k}" for k, v in DEFAULT_STEPS.items()),
    )
    warmup: int | None = Field(
        None,
        ge=0,
        description="uncounted warm-up steps (memory only); None: "
        + ", ".join(f"{v['warmup']} on {k}" for k, v in DEFAULT_STEPS.items()),
    )
    passes: Literal["both", "timing", "memory"] = Field(
        "both",
        description="memory only: both passes (the timed steps, then the same steps under the "
        "memory meter), timing only (a repeat of a study's step-time comparison), or memory only",
    )
    deterministic: bool = Field(False, description="torch.use_deterministic_algorithms(True)")
    variant: Variant | None = Field(None, description="model.variant; None: the recommended model")
    platform: Annotated[str | None, AfterValidator(_platform_path)] = Field(
        None, description="platform profile (name or YAML path); None: this machine"
    )
    allocator: Literal["platform", "default"] = Field(
        "platform",
        description="memory only: platform applies the platform profile's host allocator "
        "settings inside the measuring process at the start of the measurement (on a CPU "
        "without a platform, local_cpu's: glibc keeps freed memory); default: the allocator as "
        "it comes, as an unconfigured training sees it",
    )
    data_dir: str | None = Field(None, description="TFDS data directory; None: data.data_dir")
    dtype: Dtype | None = Field(None, description="float32 or bfloat16; None: platform or config")
    seed: int | None = Field(
        None, ge=0, description="initialisation and event-selection seed; None: train.seed"
    )
    overrides: Annotated[Overrides, AfterValidator(_owned_keys_refused)] = Field(
        default_factory=list, description="dotted configuration overrides KEY=VALUE"
    )
    output: str | None = Field(
        None, description=f"report path; None: {SCRATCH_DIR}/NAME.json (NAME: the report name)"
    )
    progress: bool = Field(True, description="progress bar (display only)")
    #: the platform profile, read once when the request is validated
    _profile: PlatformConfig | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _kind_and_device_defaults(self) -> MeasurementRequest:
        self._profile = load_platform(self.platform) if self.platform else None
        if self.kind == PARITY:
            fields = type(self).model_fields
            given = [n for n in _MEMORY_ONLY if getattr(self, n) != fields[n].default]
            if given:
                verb, pronoun = ("does", "it") if len(given) == 1 else ("do", "them")
                raise ValueError(
                    f"{' and '.join(given)} {verb} not apply to a parity measurement (it compares "
                    f"one batch with and without checkpointing); leave {pronoun} out"
                )
            return self
        defaults = DEFAULT_STEPS[self.device.type]
        self.steps = defaults["steps"] if self.steps is None else self.steps
        self.warmup = defaults["warmup"] if self.warmup is None else self.warmup
        return self

    def resolve(self) -> Measurement:
        """Resolved once: everything downstream reads the result and rebuilds nothing."""
        profile, device = self._profile, self.device
        config = self._config(profile)
        allocator = (
            {} if self.allocator == "default" else measurement_allocator(profile, device.type) or {}
        )
        path = Path(self.output) if self.output else SCRATCH_DIR / f"{self.name}.json"
        return Measurement(
            self, config, plan_of(config), device, profile, allocator, self.name, path
        )

    @property
    def device(self) -> torch.device:
        if self._profile is not None:
            return torch.device("cpu" if self._profile.device == "cpu" else "cuda")
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def _config(self, profile: PlatformConfig | None) -> Config:
        train: dict[str, Any] = {"global_batch_size": self.batch_size}
        heptv2: dict[str, Any] = {"activation_checkpointing": self.checkpointing}
        model: dict[str, Any] = {"heptv2": heptv2}
        # bench validates on batch_size test-split events and keeps no held-out test set
        data: dict[str, Any] = {"nvalid": self.batch_size, "ntest": 0, "batching": self.batching}
        if profile is not None:
            train["dtype"] = profile.dtype
            heptv2["attention_backend"] = profile.attention_backend
        if self.variant is not None:
            model["variant"] = self.variant
            data["dataset"] = DATASET_OF_VARIANT[self.variant]
        if self.data_dir is not None:
            data["data_dir"] = self.data_dir
        if self.dtype is not None:
            train["dtype"] = self.dtype
        if self.seed is not None:
            train["seed"] = self.seed
        return load_config(
            base={"model": model, "data": data, "train": train}, overrides=self.overrides
        )

    @property
    def name(self) -> str:
        """The report name, e.g. ``checkpointed_every2_b4``, ``packed_baseline_b4`` or
        ``parity_deterministic_b1``."""
        b = self.batch_size
        packed = "packed_" if is_packed(self.batching) else ""
        if self.kind == PARITY:
            return f"{packed}parity{'_deterministic' if self.deterministic else ''}_b{b}"
        return f"{packed}{report_part(self.checkpointing)}_b{b}"


@dataclass(frozen=True)
class Measurement:
    """A request resolved once (:meth:`MeasurementRequest.resolve`)."""

    request: MeasurementRequest
    config: Config
    #: off for a parity measurement, which compares off with full itself
    plan: CheckpointPlan
    device: torch.device
    profile: PlatformConfig | None
    #: host allocator settings applied in the measuring process ({}: the allocator as it comes)
    allocator: dict[str, str]
    name: str
    report_path: Path

    @property
    def batch_size(self) -> int:
        return self.request.batch_size


#: Request fields a paired timing does not take: its plans are its own, it measures time only,
#: with every layer wrapped (heptstudy.measure.paired).
NOT_PAIRED = ("kind", "checkpointing", "passes", "deterministic")

#: Parameters of each notebook (and keys of a matrix run of that notebook) that are the request's
#: (``paired.ipynb`` has its plans and rounds besides).
NOTEBOOK_PARAMETERS: dict[str, tuple[str, ...]] = {
    MEMORY: tuple(f for f in MeasurementRequest.model_fields if f not in ("kind", "progress")),
    PARITY: tuple(
        f for f in MeasurementRequest.model_fields if f not in ("kind", "progress", *_MEMORY_ONLY)
    ),
    PAIRED: tuple(f for f in MeasurementRequest.model_fields if f not in ("progress", *NOT_PAIRED)),
}


def from_notebook(kind: str, namespace: Mapping[str, Any]) -> MeasurementRequest:
    """The request of ``memory.ipynb`` or ``parity.ipynb`` from the kernel's globals."""
    allowed = NOTEBOOK_PARAMETERS[kind]
    return MeasurementRequest.from_namespace(namespace, allowed, f"{kind}.ipynb", kind=kind)
