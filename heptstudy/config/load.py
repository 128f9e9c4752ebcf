"""The whole configuration: defaults, then files and overrides merged, then validated."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, Field, ValidationError, model_validator

from heptstudy.config.data import DataConfig
from heptstudy.config.model import HIT_VARIANT, TRACK_CLUSTER_VARIANT, ModelConfig
from heptstudy.config.platform import PlatformConfig
from heptstudy.config.strict import StrictInput
from heptstudy.config.train import TrainConfig
from heptstudy.config.yaml_text import as_yaml, parse_overrides, read_yaml
from heptstudy.errors import ConfigError, describe_invalid
from heptstudy.paths import resolve_from_cwd, resolve_in_repo


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
