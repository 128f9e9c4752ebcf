"""The one measurement request: what `heptstudy bench`, ``memory.ipynb``, ``parity.ipynb`` and a
row of a study matrix ask for, validated once, with every default stated here.

::

    request = MeasurementRequest.build(batch_size="4", checkpointing="true")   # strings parse
    config = request.config()          # the resolved, validated Config (no dotted round trip)
    request.name                       # "checkpointed_b4": the report name
    request.report_path()              # output, or experiments/scratch/NAME.json

Papermill hands ``-p checkpointing true`` over as the *string* ``"true"``: strings of digits are
integers, ``true``/``false`` (any case) are booleans, ``none``/empty is None. Booleans are never
integers and numbers are never booleans. Unknown parameters are refused by name (with the nearest
known one); papermill itself only warns about them, so :func:`from_notebook` checks the parameters
papermill injected into the kernel as well.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import torch
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from heptstudy.config import (
    HIT_VARIANT,
    TRACK_CLUSTER_VARIANT,
    Config,
    ModelConfig,
    PlatformConfig,
    TrainConfig,
    load_config,
    load_platform,
)
from heptstudy.errors import ConfigError

#: The allowed values come from the configuration schema itself.
Variant = ModelConfig.model_fields["variant"].annotation
Dtype = TrainConfig.model_fields["dtype"].annotation

MEMORY, PARITY = "memory", "parity"

#: Counted and warm-up steps of a memory measurement that does not give them, by device: the
#: GPU protocol of the original measurements, and fewer on CPU where one full-size step takes
#: seconds per event (and every memory run executes its steps twice: timed, then tracked).
DEFAULT_STEPS = {"cpu": {"steps": 2, "warmup": 1}, "cuda": {"steps": 5, "warmup": 2}}

#: Where a request without ``output`` writes its report.
SCRATCH_DIR = Path("experiments/scratch")

DATASET_OF_VARIANT = {
    HIT_VARIANT: "cld_edm_ttbar_hits:3.2.1",
    TRACK_CLUSTER_VARIANT: "cld_edm_ttbar_pf:3.2.1",
}

#: Configuration keys that a request parameter sets: an override may not set them as well.
_OWNED_KEYS = {
    "model.heptv2.activation_checkpointing": "checkpointing",
    "model.variant": "variant",
    "data.data_dir": "data_dir",
    "train.dtype": "dtype",
    "train.seed": "seed",
}

_NONE_WORDS = ("", "none", "null")


class RequestError(ConfigError):
    """A measurement parameter (command-line option, notebook parameter, matrix key) is unusable."""


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS)


def parse_bool(value: Any) -> bool:
    """``True``/``False`` (YAML booleans included) or the strings ``true``/``false``, any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    why = "; a number is not a boolean" if isinstance(value, (int, float)) else ""
    raise ValueError(f"allowed values are true or false (any case){why}")


def parse_checkpointing(value: Any) -> bool | str:
    """A flag, or ``auto`` (any case): a plan per step within the memory budget."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return parse_bool(value)
    except ValueError as err:
        raise ValueError(f"{err}; or auto (a checkpointing plan per step)") from None


def parse_int(value: Any, low: int, optional: bool = False) -> int | None:
    """An integer ``>= low`` (a string of digits too); None only when ``optional``."""
    if optional and _is_none(value):
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        allowed = f"allowed values are integers >= {low}" + (" or None" if optional else "")
        raise ValueError(
            allowed + ("; a boolean is not an integer" if isinstance(value, bool) else "")
        )
    return value


def parse_overrides(value: Any) -> list[str]:
    """A list of ``KEY=VALUE`` strings; one string holds several separated by whitespace."""
    if value is None:
        return []
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(
        isinstance(i, str) and "=" in i and not i.startswith("=") for i in items
    ):
        raise ValueError(
            "allowed values are a list of KEY=VALUE strings (-y 'overrides: [train.lr=0.002]') "
            'or one string of them separated by spaces ("train.lr=0.002 model.heptv2.width=256")'
        )
    return list(items)


def find_platform(value: str) -> str:
    """A platform profile: a YAML path, or a name in ``configs/training/platforms``."""
    from heptstudy.paths import PLATFORM_DIR, find_file

    found = find_file(value, PLATFORM_DIR)
    if found is None:
        names = ", ".join(sorted(p.stem for p in PLATFORM_DIR.glob("*.yaml")))
        raise ValueError(f"allowed values are a platform YAML path or one of {names}, or None")
    return str(found)


def parse_choice(value: Any, choices: tuple[str, ...]) -> str | None:
    if _is_none(value):
        return None
    if isinstance(value, str) and value.strip() in choices:
        return value.strip()
    raise ValueError(f"allowed values are {', '.join(choices)} or None (the default)")


def parse_path(value: Any) -> str | None:
    if _is_none(value):
        return None
    if isinstance(value, (str, Path)):
        return str(value)
    raise ValueError("allowed values are a path (a string) or None")


def parse_platform(value: Any) -> str | None:
    if _is_none(value):
        return None
    if not isinstance(value, (str, Path)):
        raise ValueError("allowed values are a platform name or YAML path, or None")
    return find_platform(str(value))


def _owned_keys_refused(items: list[str]) -> list[str]:
    for item in items:
        key = item.split("=", 1)[0].strip()
        if key in _OWNED_KEYS:
            raise ValueError(
                f"{item!r} sets a key that has its own parameter: give "
                f"{_OWNED_KEYS[key]} instead of overriding {key}"
            )
    return items


# Parameter types: what every entry point may hand over (see the module docstring).
Flag = Annotated[bool, BeforeValidator(parse_bool)]
Count = Annotated[int, BeforeValidator(partial(parse_int, low=1))]
OptionalCount = Annotated[int | None, BeforeValidator(partial(parse_int, low=1, optional=True))]
OptionalNumber = Annotated[int | None, BeforeValidator(partial(parse_int, low=0, optional=True))]
OptionalPath = Annotated[str | None, BeforeValidator(parse_path)]
Overrides = Annotated[list[str], BeforeValidator(parse_overrides)]
OptionalVariant = Annotated[
    Variant | None, BeforeValidator(partial(parse_choice, choices=get_args(Variant)))
]
OptionalDtype = Annotated[
    Dtype | None, BeforeValidator(partial(parse_choice, choices=get_args(Dtype)))
]


class MeasurementRequest(BaseModel):
    """One measurement: memory and step time (``kind="memory"``) or checkpointing parity."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["memory", "parity"] = Field(
        MEMORY, description="memory (peak memory and step time) or parity (checkpointing parity)"
    )
    batch_size: Count = Field(1, description="events per step, an integer >= 1")
    checkpointing: Annotated[bool | Literal["auto"], BeforeValidator(parse_checkpointing)] = Field(
        False,
        description="activation checkpointing of the HEPTv2 layers (memory only): true, false, "
        "or auto (a plan per step within model.heptv2.memory_budget_gib)",
    )
    steps: OptionalCount = Field(
        None,
        description="counted steps (memory only); None: "
        + ", ".join(f"{v['steps']} on {k}" for k, v in DEFAULT_STEPS.items()),
    )
    warmup: OptionalNumber = Field(
        None,
        description="uncounted warm-up steps (memory only); None: "
        + ", ".join(f"{v['warmup']} on {k}" for k, v in DEFAULT_STEPS.items()),
    )
    passes: Literal["both", "timing", "memory"] = Field(
        "both",
        description="memory only: both passes (the timed steps, then the same steps under the "
        "memory meter), timing only (a repeat of a study's step-time comparison), or memory only",
    )
    deterministic: Flag = Field(False, description="torch.use_deterministic_algorithms(True)")
    variant: OptionalVariant = Field(None, description="model.variant; None: the recommended model")
    platform: Annotated[str | None, BeforeValidator(parse_platform)] = Field(
        None,
        description="platform profile (name or YAML path); None: this machine (on a CPU, "
        "heptstudy bench starts itself with local_cpu's allocator setting)",
    )
    data_dir: OptionalPath = Field(None, description="TFDS data directory; None: data.data_dir")
    dtype: OptionalDtype = Field(None, description="float32 or bfloat16; None: platform or config")
    seed: OptionalNumber = Field(
        None, description="initialisation and event-selection seed; None: train.seed"
    )
    overrides: Annotated[Overrides, AfterValidator(_owned_keys_refused)] = Field(
        default_factory=list, description="dotted configuration overrides KEY=VALUE"
    )
    output: OptionalPath = Field(
        None, description=f"report path; None: {SCRATCH_DIR}/NAME.json (NAME: the report name)"
    )
    progress: Flag = Field(True, description="progress bar (display only)")

    @field_validator("kind", mode="before")
    @classmethod
    def _kind(cls, value: Any) -> str:
        if isinstance(value, str) and value.strip() in (MEMORY, PARITY):
            return value.strip()
        raise ValueError(f"allowed values are {MEMORY} or {PARITY}")

    @model_validator(mode="after")
    def _kind_and_device_defaults(self) -> MeasurementRequest:
        if self.kind == PARITY:
            given = [n for n in ("steps", "warmup") if getattr(self, n) is not None] + (
                ["checkpointing"] if self.checkpointing else []
            )
            given += ["passes"] if self.passes != "both" else []
            if given:
                verb, pronoun = ("does", "it") if len(given) == 1 else ("do", "them")
                raise ValueError(
                    f"{' and '.join(given)} {verb} not apply to a parity measurement (it compares "
                    f"one batch with and without checkpointing); leave {pronoun} out"
                )
            return self
        defaults = DEFAULT_STEPS[self.device.type]
        if self.steps is None:
            self.steps = defaults["steps"]
        if self.warmup is None:
            self.warmup = defaults["warmup"]
        return self

    @classmethod
    def build(cls, **values: Any) -> MeasurementRequest:
        """Validate ``values``; a :class:`RequestError` names every bad parameter."""
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise RequestError(describe_errors(err, sorted(cls.model_fields))) from None

    # ---------------------------------------------------------------- what it resolves to

    def platform_profile(self) -> PlatformConfig | None:
        return load_platform(self.platform) if self.platform else None

    @property
    def device(self) -> torch.device:
        """The platform's device, else CUDA when this PyTorch sees a GPU, else the CPU."""
        profile = self.platform_profile()
        if profile is not None:
            return torch.device("cpu" if profile.device == "cpu" else "cuda")
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def config(self) -> Config:
        """The validated configuration: defaults, then the request's settings, then the user's
        overrides (the only part OmegaConf parses)."""
        train: dict[str, Any] = {}
        heptv2: dict[str, Any] = {"activation_checkpointing": self.checkpointing}
        model: dict[str, Any] = {"heptv2": heptv2}
        # bench validates on batch_size test-split events and keeps no held-out test set
        data: dict[str, Any] = {"nvalid": self.batch_size, "ntest": 0}
        profile = self.platform_profile()
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

    def report_name(self, config: Config | None = None) -> str:
        """``baseline_b4``; ``checkpointed_b4`` (full policy, every layer);
        ``checkpointed_selective_b4``, ``checkpointed_every2_b4`` for other policies;
        ``parity_b1``, ``parity_deterministic_b1``."""
        b = self.batch_size
        if self.kind == PARITY:
            return f"parity{'_deterministic' if self.deterministic else ''}_b{b}"
        if not self.checkpointing:
            return f"baseline_b{b}"
        if self.checkpointing == "auto":
            return f"auto_b{b}"
        h = (config or self.config()).model.heptv2
        policy = (
            ""
            if h.activation_checkpointing_policy == "full"
            else f"_{h.activation_checkpointing_policy}"
        )
        every = "" if h.checkpoint_every == 1 else f"_every{h.checkpoint_every}"
        return f"checkpointed{policy}{every}_b{b}"

    @property
    def name(self) -> str:
        return self.report_name()

    def report_path(self, config: Config | None = None) -> Path:
        return (
            Path(self.output) if self.output else SCRATCH_DIR / f"{self.report_name(config)}.json"
        )

    def events_needed(self) -> int:
        """Training-split events of the measured steps: every step has its own events."""
        steps = 1 if self.kind == PARITY else self.warmup + self.steps
        return self.batch_size * steps


#: Parameters of each notebook (and keys of a matrix run of that notebook).
NOTEBOOK_PARAMETERS: dict[str, tuple[str, ...]] = {
    MEMORY: tuple(f for f in MeasurementRequest.model_fields if f not in ("kind", "progress")),
    PARITY: tuple(
        f
        for f in MeasurementRequest.model_fields
        if f not in ("kind", "progress", "checkpointing", "steps", "warmup", "passes")
    ),
}


def describe_errors(err: ValidationError, known: list[str]) -> str:
    """One line per bad parameter: the name, the value, what is allowed."""
    lines = []
    for e in err.errors():
        name = ".".join(str(p) for p in e["loc"])
        value = e.get("input")
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            lines.append(f"unknown parameter {name}={value!r}{hint} (known: {', '.join(known)})")
        elif not name:  # a check across parameters
            lines.append(msg)
        else:
            lines.append(f"parameter {name}={value!r} is not allowed: {msg}")
    return "\n".join(lines)


def injected_parameters(history: Any) -> set[str] | None:
    """The names papermill assigned in the cell it injected just before the running one, read
    from IPython's input history ``In``; None when the cell before was not papermill's (a run
    in JupyterLab, or no IPython)."""
    if not isinstance(history, list) or len(history) < 2:
        return None
    source = history[-2]
    if not isinstance(source, str) or not source.lstrip().startswith("# Parameters"):
        return None
    names: set[str] = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def check_parameters(given: set[str] | None, allowed: tuple[str, ...], where: str) -> None:
    """Refuse parameters a notebook does not have: papermill only warns and runs on with the
    defaults, which measures something else than was asked."""
    unknown = sorted((given or set()) - set(allowed))
    if unknown:
        hints = []
        for name in unknown:
            near = difflib.get_close_matches(name, allowed, n=1)
            hints.append(f"{name}" + (f" (did you mean {near[0]}?)" if near else ""))
        raise RequestError(
            f"{where} has no parameter {', '.join(hints)}; its parameters are "
            f"{', '.join(allowed)}. Fix the -p/-y name and run it again"
        )


def from_notebook(kind: str, namespace: Mapping[str, Any]) -> MeasurementRequest:
    """The request of ``memory.ipynb`` or ``parity.ipynb`` from the kernel's globals: the
    notebook's parameters, after refusing any papermill injected that it does not have."""
    allowed = NOTEBOOK_PARAMETERS[kind]
    check_parameters(injected_parameters(namespace.get("In")), allowed, f"{kind}.ipynb")
    return MeasurementRequest.build(
        kind=kind, **{k: namespace[k] for k in allowed if k in namespace}
    )


__all__ = [
    "DEFAULT_STEPS",
    "MEMORY",
    "NOTEBOOK_PARAMETERS",
    "PARITY",
    "MeasurementRequest",
    "RequestError",
    "check_parameters",
    "from_notebook",
    "injected_parameters",
]
