"""The ``model`` section: the variant and its parts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from heptstudy.config.plans import PLAN_WORDS, PlanOrder, count_plan, parse_plan_name
from heptstudy.config.strict import StrictInput

HIT_VARIANT = "hit_heptv2_grouped_tracker_features"
#: The cost table of the recommended model, measured on a CPU (configs/checkpointing/README.md).
DEFAULT_OP_COSTS = "configs/checkpointing/op_costs_cpu.json"


def _json_path(value: str) -> str:
    if not value.strip() or not value.endswith(".json"):
        raise ValueError(
            f"is the path of a cost table written by `heptstudy costs` (a .json file), not "
            f"{value!r}; e.g. {DEFAULT_OP_COSTS}"
        )
    return value


TRACK_CLUSTER_VARIANT = "track_cluster_mlpf"


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
    op_costs: Annotated[str, AfterValidator(_json_path)] = Field(
        DEFAULT_OP_COSTS,
        description="keepNN plans: the measured op-group cost table (`heptstudy costs`) their "
        "keep-sets are solved on, for this model configuration; a relative path is read from "
        "the repository",
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
