"""Validated configuration: YAML files plus dotted overrides (parsed by OmegaConf), checked by
a pydantic schema naming key, value and what is allowed; unlike plain pydantic, a number key
refuses true/false and a true/false key refuses numbers."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from contextlib import suppress
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from heptstudy.errors import ConfigError, describe_invalid
from heptstudy.names import check_name
from heptstudy.paths import resolve_from_cwd, resolve_in_repo

HIT_VARIANT = "hit_heptv2_grouped_tracker_features"
TRACK_CLUSTER_VARIANT = "track_cluster_mlpf"

#: The plans (:mod:`heptstudy.model.checkpoint_plan`) besides ``layersK``, ``lastK`` and ``auto``.
FIXED_PLANS = ("off", "full", "selective", "every2", "every3")
PLAN_WORDS = (
    "off, full, selective, every2, every3, layersK or lastK (the first or last K backbone "
    "layers) or auto"
)


def count_plan(name: str) -> tuple[bool, int] | None:
    """``(last, K)`` of a count plan (``layersK``: first K backbone layers, ``lastK``: last K)."""
    match = re.fullmatch(r"(layers|last)(\d+)", name)
    return None if match is None else (match[1] == "last", int(match[2]))


def parse_plan_name(value: Any) -> str:
    """A checkpointing plan's name as written everywhere (lower case, ``layers3``); true is
    ``full``, false (YAML's bare ``off``) ``off``. The configuration checks count plans' K."""
    if isinstance(value, bool):
        return "full" if value else "off"
    if isinstance(value, str):
        word = value.strip().lower()
        word = {"true": "full", "false": "off"}.get(word, word)
        count = count_plan(word)
        if count is not None:
            return f"{'last' if count[0] else 'layers'}{count[1]}"
        if word in (*FIXED_PLANS, "auto"):
            return word
    why = "; a number is not a checkpointing plan" if isinstance(value, (int, float)) else ""
    raise ValueError(f"allowed values are {PLAN_WORDS} (true/false: full/off){why}")


def as_yaml(value: Any) -> str:
    """``value`` as a user writes it in YAML or ``--set`` (true, not True)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _scalar_kind(annotation: Any) -> Any:
    """``int``, ``float`` or ``bool`` for a field of that scalar (or a list or tuple of it)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _scalar_kind(get_args(annotation)[0])
    if origin in (Union, UnionType):  # optional: X | None
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        return _scalar_kind(kinds[0]) if len(kinds) == 1 else None
    if origin in (list, tuple):
        kinds = {_scalar_kind(a) for a in get_args(annotation) if a is not Ellipsis}
        return kinds.pop() if len(kinds) == 1 else None
    return annotation if annotation in (int, float, bool) else None


def _bool_mixup(kind: Any, value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_bool_mixup(kind, v) for v in value)
    if kind in (int, float):
        return isinstance(value, bool)
    return kind is bool and isinstance(value, (int, float)) and not isinstance(value, bool)


class StrictInput(BaseModel):
    """The schema of user input (configuration, measurement request); a string given for a
    number or true/false is read as a ``--set KEY=VALUE``'s VALUE is."""

    # NaN and the infinities refused: none is meant, and reports record configurations as JSON
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode turns true into 1 and 1 into true: a typo, never an intention
        field = cls.model_fields.get(info.field_name or "")
        kind = _scalar_kind(field.annotation) if field else None
        if kind is None:
            return value
        if isinstance(value, str):  # as the VALUE of KEY=VALUE; unreadable text stays
            with suppress(ConfigError):
                value = parse_overrides([f"value={value}"])["value"]
        if not _bool_mixup(kind, value):
            return value
        wanted = "true or false" if kind is bool else f"{'a whole' if kind is int else 'a'} number"
        got = "a number" if kind is bool else "true/false"
        default = field.get_default(call_default_factory=True)
        example = f", for example the default {as_yaml(default)}" if default is not None else ""
        raise PydanticCustomError(
            "bool_number_mixup",
            f"takes {wanted}, not {got}; give {wanted}{example or ' or null (the default)'}",
        )


def _off_not_listed(value: Any) -> Any:
    if isinstance(value, list) and any(v is False or v == "off" for v in value):  # YAML: off=false
        raise PydanticCustomError(
            "plan_order",
            "lists the checkpointing plans tried after off, which is always tried first: "
            "leave off out, for example [every2, full]",
        )
    return value


def check_plan_order(value: list[str] | None) -> list[str] | None:
    """An ``auto_plan_order``: plan names other than off and auto, each once, at least one."""
    if value is not None and (
        not value
        or len(set(value)) != len(value)
        or not all(v in FIXED_PLANS[1:] or count_plan(v) for v in value)
    ):
        raise PydanticCustomError(
            "plan_order",
            "takes each of selective, every2, every3, full, layersK (the first K backbone "
            "layers) and lastK (the last K) at most once, at least one, cheapest first, not "
            f"{as_yaml(value)}; for example [every2, full]",
        )
    return value if value is None else [parse_plan_name(v) for v in value]


PlanOrder = Annotated[
    list[str] | None, BeforeValidator(_off_not_listed), AfterValidator(check_plan_order)
]


class HEPTv2Config(StrictInput):
    embedding_dim: int = Field(128, ge=8, description="model dimension of the hit embeddings")
    width: int = Field(512, ge=8, description="hidden width of the input encoders and heads")
    num_convs: int = Field(6, ge=1, description="number of HEPTv2 backbone layers")
    num_heads: int = Field(8, ge=1)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    block_size: int = Field(100, ge=1, description="hits per attention bucket")
    n_hashes: int = Field(3, ge=1, description="OR-rounds of hashing")
    num_regions: int = Field(140, ge=1, description="AND-regions per hash (eta x phi cells)")
    mlp_ratio: float = Field(4.0, gt=0.0)
    activation_checkpointing: Annotated[str, BeforeValidator(parse_plan_name)] = Field(
        "off",
        description=f"the checkpointing plan: {PLAN_WORDS}; auto: per training step, the "
        "cheapest plan whose predicted peak fits model.heptv2.memory_budget_gib "
        "(heptstudy.model.adaptive_checkpointing); true/false: full/off",
    )
    memory_budget_gib: float | None = Field(
        None,
        gt=0.0,
        description="peak memory one step may use under activation_checkpointing=auto; None: "
        "the platform's device memory less its safety margin",
    )
    auto_plan_order: PlanOrder = Field(
        None,
        description="activation_checkpointing=auto: the plans tried after off (always tried "
        "first), cheapest first. None: the platform profile's auto_plan_order, else "
        "heptstudy.model.adaptive_checkpointing.DEFAULT_PLAN_ORDER",
    )
    attention_backend: Literal["auto", "fused", "plain"] = Field(
        "auto", description="auto: fused flex_attention on CUDA, plain PyTorch elsewhere"
    )
    hash_seed: int = Field(0, ge=0, description="seed of the fixed random hash tables")

    @property
    def adaptive(self) -> bool:
        """Whether each training step chooses its own checkpointing plan (``auto``)."""
        return self.activation_checkpointing == "auto"

    @model_validator(mode="after")
    def _fits_the_backbone(self) -> HEPTv2Config:
        named = [("activation_checkpointing", self.activation_checkpointing)]
        named += [("auto_plan_order", name) for name in self.auto_plan_order or ()]
        for key, name in named:
            if (count := count_plan(name)) is not None and not 1 <= count[1] < self.num_convs:
                allowed = (
                    f"a count plan takes 1 to {self.num_convs - 1} layers (all of them is full): "
                    "use one of those or full"
                    if self.num_convs > 1
                    else "a backbone of one layer has no count plan (its one layer is full): "
                    "use full or off"
                )
                raise ValueError(
                    f"model.heptv2.{key}: {name} checkpoints {count[1]} of the backbone's "
                    f"{self.num_convs} layers (model.heptv2.num_convs); {allowed}"
                )
        if self.embedding_dim % self.num_heads:
            raise ValueError(
                f"model.heptv2.embedding_dim={self.embedding_dim} must be divisible by "
                f"model.heptv2.num_heads={self.num_heads}"
            )
        return self


class DecoderConfig(StrictInput):
    num_layers: int = Field(4, ge=1)
    num_queries: int = Field(256, ge=1, description="learned particle queries per event")
    num_heads: int = Field(8, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)


class TrackerFeaturesConfig(StrictInput):
    enabled: bool = True
    # at most 1.0: the phi wrap-around handling of the features reaches that far past the seam
    radii: list[Annotated[float, Field(gt=0.0, le=1.0)]] = Field(
        default_factory=lambda: [0.02, 0.05],
        min_length=1,
        description="(eta, phi) distances within which tracker hits are counted, each in (0, 1]",
    )

    @property
    def num_features(self) -> int:
        """A count per radius, then mean radius, spread and distance to the nearest tracker hit."""
        return len(self.radii) + 3 if self.enabled else 0


class TrackClusterConfig(StrictInput):
    num_layers: int = Field(6, ge=1)
    embedding_dim: int = Field(128, ge=8)
    width: int = Field(512, ge=8)
    num_heads: int = Field(8, ge=1)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)


class FreezeConfig(StrictInput):
    input_encoder: bool = Field(False, description="freeze the per-type input encoders")


class ModelConfig(StrictInput):
    variant: Literal["hit_heptv2_grouped_tracker_features", "track_cluster_mlpf"] = HIT_VARIANT
    heptv2: HEPTv2Config = Field(default_factory=HEPTv2Config)
    decoder: DecoderConfig = Field(default_factory=DecoderConfig)
    tracker_features: TrackerFeaturesConfig = Field(default_factory=TrackerFeaturesConfig)
    track_cluster: TrackClusterConfig = Field(default_factory=TrackClusterConfig)
    freeze: FreezeConfig = Field(default_factory=FreezeConfig)


class DataConfig(StrictInput):
    data_dir: str = "data/tfds"
    dataset: str = Field("cld_edm_ttbar_hits:3.2.1", pattern=r"^[a-z0-9_]+:\d+\.\d+\.\d+$")
    configs: list[str] = Field(default_factory=lambda: ["1"], min_length=1)
    pad_to_multiple: int = Field(128, ge=1)
    batching: Literal["padded", "packed"] = Field(
        "padded",
        description="padded: every event filled to the batch's longest (the recipe's); packed: "
        "the batch's events in one stream of hits, each rounded up on its own",
    )
    sampler: Literal["interleaved_shards", "sequential"] = "interleaved_shards"
    nvalid: int = Field(16, ge=0)
    ntest: int = Field(16, ge=0)
    num_workers: int = Field(0, ge=0, description="reader threads per batch (0: read in turn)")
    prefetch_batches: int = Field(
        2, ge=0, description="batches read ahead during training while a step runs (0: none)"
    )

    @field_validator("configs")
    @classmethod
    def _configs_once(cls, configs: list[str]) -> list[str]:
        if repeated := sorted({c for c in configs if configs.count(c) > 1}):
            # a repeated builder config would read its events twice as if they were others
            raise ValueError(
                f"data.configs={configs} names {repeated} more than once; list each builder "
                "config once"
            )
        return configs

    @property
    def name(self) -> str:
        return self.dataset.split(":")[0]

    @property
    def version(self) -> str:
        return self.dataset.split(":")[1]


class LossConfig(StrictInput):
    class_weight: float = Field(1.0, ge=0.0)
    no_particle_weight: float = Field(0.1, ge=0.0, description="CE weight of the 'none' class")
    momentum_weight: float = Field(1.0, ge=0.0)
    group_bce_weight: float = Field(1.0, ge=0.0)
    group_dice_weight: float = Field(1.0, ge=0.0)
    group_loss: Literal["bce", "focal"] = "bce"
    aux_weight: float = Field(1.0, ge=0.0, description="weight of each auxiliary decoder layer")
    cost_class: float = Field(1.0, ge=0.0)
    cost_momentum: float = Field(1.0, ge=0.0)
    cost_mask: float = Field(1.0, ge=0.0)
    cost_dice: float = Field(1.0, ge=0.0)


class LambConfig(StrictInput):
    """LAMB as particleflow's ``mlpf/optimizers/lamb.py`` runs it (see heptstudy.train.lamb)."""

    bias_correction: bool = Field(
        True, description="divide the moment estimates by 1 - beta^step (Adam's correction)"
    )
    max_grad_norm: float = Field(
        1.0,
        ge=0.0,
        description="scale all gradients down together when their global L2 norm exceeds this "
        "(0: no clipping)",
    )
    weight_decay_on: Literal["all", "matrices"] = Field(
        "all",
        description="all: every trainable parameter, as particleflow; matrices: tensors with two "
        "or more dimensions only (biases and norm scales neither decayed nor trust-scaled)",
    )


class TrainConfig(StrictInput):
    global_batch_size: int = Field(4, ge=1)
    grad_accumulation: int = Field(1, ge=1)
    num_steps: int = Field(100, ge=1)
    seed: int = Field(12345, ge=0)
    optimizer: Literal["lamb"] = "lamb"
    lr: float = Field(1e-3, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    lamb: LambConfig = Field(default_factory=LambConfig)
    lr_final_fraction: float = Field(0.1, ge=0.0, le=1.0)
    val_freq: int = Field(50, ge=1)
    checkpoint_freq: int = Field(50, ge=1)
    dtype: Literal["float32", "bfloat16"] = "float32"
    out_dir: str = "experiments/train"
    deterministic: bool = False
    loss: LossConfig = Field(default_factory=LossConfig)


class Config(StrictInput):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @model_validator(mode="after")
    def _suits_the_variant(self) -> Config:
        variant = self.model.variant
        wanted = "_pf" if variant == TRACK_CLUSTER_VARIANT else "_hits"
        if not self.data.name.endswith(wanted):
            raise ValueError(
                f"data.dataset={self.data.dataset!r} does not suit model.variant="
                f"{variant!r}: that variant reads a '*{wanted}' data set "
                f"(for example cld_edm_ttbar{wanted}:3.2.1); set data.dataset accordingly"
            )
        if variant != HIT_VARIANT and self.model.heptv2.adaptive:
            raise ValueError(
                f"model.heptv2.activation_checkpointing=auto chooses how the HEPTv2 backbone is "
                f"checkpointed, which model.variant={variant!r} does not have; use it "
                f"with {HIT_VARIANT!r} or set true/false"
            )
        if variant != HIT_VARIANT and self.data.batching == "packed":
            raise ValueError(
                f"data.batching=packed runs events side by side in one stream, which only "
                f"{HIT_VARIANT!r} reads event by event; model.variant={variant!r} "
                "needs data.batching=padded"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


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


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """The mapping of a user's YAML file; every problem a :class:`ConfigError` naming the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} file {str(p)!r} is a folder; give the path of a YAML file")
    if not p.is_file():
        raise ConfigError(f"{what} file {str(p)!r} does not exist; give the path of a YAML file")
    problem = None
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        # position and the parser's words only: its snippet is the content of any file at all
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = f"is not valid YAML{where} ({getattr(err, 'problem', None) or 'unreadable'})"
    except UnicodeDecodeError:
        problem = "is not text (not UTF-8)"
    except OSError as err:
        problem = f"cannot be read ({err.strerror or err})"
    if problem is not None:
        readable = " you can read" if problem.startswith("cannot") else ""
        raise ConfigError(
            f"{what} file {str(p)!r} {problem}; give the path of a {what} YAML file{readable}"
        )
    if (loop := _alias_loop(data)) is not None:
        raise ConfigError(
            f"{what} file {str(p)!r}: {loop or 'the top level'} contains itself through a YAML "
            "alias (*name inside the &name it refers to), a value without end; write the value "
            "out, or point the alias at a section that does not hold it"
        )
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{what} file {str(p)!r} must hold a mapping, found {type(data).__name__}"
        )
    return dict(data)


def _alias_loop(data: Any) -> str | None:
    """The dotted key of a mapping or list that holds itself (PyYAML builds one from a recursive
    alias), else None; each shared value is walked once, so an alias bomb costs no more."""
    done: set[int] = set()
    path: dict[int, str] = {}
    stack: list[tuple[Any, str, bool]] = [(data, "", False)]
    while stack:
        node, where, leaving = stack.pop()
        if leaving:
            del path[id(node)]
            done.add(id(node))
            continue
        if not isinstance(node, (dict, list)) or id(node) in done:
            continue
        if id(node) in path:
            return path[id(node)]
        path[id(node)] = where
        stack.append((node, where, True))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            stack.append((value, f"{where}.{key}" if where else str(key), False))
    return None


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--set``, a request's overrides) as nested mappings."""
    items = list(overrides)
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override {item!r} is not of the form KEY=VALUE "
                "(for example model.heptv2.activation_checkpointing=true)"
            )
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(items), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise ConfigError(f"could not parse overrides {items}: {err}") from None


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_known_keys(ann, prefix + name + "."))
    return keys


def merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge plain mappings, later ones winning, a list replaced whole; a list item by
    position (``data.configs.0=2``) or a mapping for a list (or back) is refused."""
    try:
        merged = OmegaConf.merge(*[OmegaConf.create(dict(layer)) for layer in layers])
    except TypeError:  # OmegaConf's "Cannot merge incompatible container types" names no key
        below: Any = {}
        for layer in layers:
            _refuse_mixed(below, layer)
            below = OmegaConf.to_container(OmegaConf.merge(below, OmegaConf.create(dict(layer))))
        raise
    return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]


def _refuse_mixed(below: Mapping[str, Any], above: Mapping[str, Any], prefix: str = "") -> None:
    for key, new in above.items():
        old, dotted = below.get(key), f"{prefix}{key}"
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            _refuse_mixed(old, new, f"{dotted}.")
        elif isinstance(old, list) and isinstance(new, Mapping):
            whole = list(old)
            strings = all(isinstance(item, str) for item in old)  # data.configs: ["1"]
            for at, value in sorted((int(k), v) for k, v in new.items() if str(k).isdigit()):
                whole[at : at + 1] = [str(value) if strings else value]
            given = ", ".join(f"{dotted}.{k}={as_yaml(v)}" for k, v in new.items())
            written = json.dumps(whole)
            raise ConfigError(
                f"{given} cannot be merged: {dotted} is a list ({json.dumps(old)}) and a list is "
                f"set whole, not item by item; write it whole: --set '{dotted}={written}' (in "
                f"YAML: {key}: {written})"
            )
        elif isinstance(old, Mapping) and isinstance(new, list):
            raise ConfigError(
                f"{dotted}={as_yaml(new)} cannot be merged: {dotted} is a section of keys "
                f"({', '.join(map(str, old)) or 'none yet'}), not a list; set its keys one by one, "
                f"e.g. --set {dotted}.KEY=VALUE"
            )


def validate(
    data: Mapping[str, Any], what: str = "configuration", schema: type[BaseModel] = Config
) -> Any:
    """``data`` validated by ``schema`` (default :class:`Config`), errors naming key and value."""
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise ConfigError(
            describe_invalid(
                err,
                noun="key",
                known=_known_keys(schema),
                header=f"invalid {what}:",
                footer="fix the YAML file or the --set override named above and try again",
                show=lambda v: repr(v) if isinstance(v, str) else as_yaml(v),  # as in YAML
            )
        ) from None


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    base: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults (the hit model), then ``base``, the YAML at ``path`` and overrides; validated."""
    layers: list[Mapping[str, Any]] = [Config().to_dict()]
    if base:
        layers.append(base)
    if path is not None:
        layers.append(read_yaml(path, "configuration"))
    layers.append(parse_overrides(overrides))
    try:
        merged = merge(*layers)
    except OmegaConfBaseException as err:
        raise ConfigError(f"could not merge configuration: {err}") from None
    config = validate(merged)
    # made absolute as heptstudy.paths says: data in the repository, outputs in the cwd
    config.data.data_dir = str(resolve_in_repo(config.data.data_dir))
    config.train.out_dir = str(resolve_from_cwd(config.train.out_dir))
    return config


def load_platform(path: str | Path) -> PlatformConfig:
    data = read_yaml(path, "platform")
    if not set(data) & set(PlatformConfig.model_fields):
        # not a profile at all: its keys and values are some other file's content, not shown
        raise ConfigError(
            f"platform file {str(path)!r} is not a platform profile: none of its {len(data)} "
            f"keys is a profile field (a profile sets {', '.join(list(PlatformConfig.model_fields)[:4])}"
            ", ...). Give a profile's name (e.g. h100, lumi_mi250x, local_cpu) or the path of one "
            "in configs/training/platforms/"
        )
    return validate(data, f"platform profile {str(path)!r}", PlatformConfig)
