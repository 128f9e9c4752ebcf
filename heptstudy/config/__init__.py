"""Validated configuration: YAML files plus dotted overrides (parsed by OmegaConf), checked by
a pydantic schema naming key, value and what is allowed; unlike plain pydantic, a number key
refuses true/false and a true/false key refuses numbers."""

from heptstudy.config.data import DataConfig
from heptstudy.config.load import Config, load_config, load_platform, merge, validate
from heptstudy.config.model import HIT_VARIANT, TRACK_CLUSTER_VARIANT, HEPTv2Config, ModelConfig
from heptstudy.config.plans import (
    FIXED_PLANS,
    PLAN_WORDS,
    count_plan,
    keep_percent,
    parse_plan_name,
)
from heptstudy.config.platform import ALLOC_CONF_VARS, PlatformConfig
from heptstudy.config.strict import StrictInput
from heptstudy.config.train import LossConfig, TrainConfig
from heptstudy.config.yaml_text import as_yaml, parse_overrides, read_yaml
from heptstudy.errors import ConfigError

__all__ = [
    "ALLOC_CONF_VARS",
    "FIXED_PLANS",
    "HIT_VARIANT",
    "PLAN_WORDS",
    "TRACK_CLUSTER_VARIANT",
    "Config",
    "ConfigError",
    "DataConfig",
    "HEPTv2Config",
    "LossConfig",
    "ModelConfig",
    "PlatformConfig",
    "StrictInput",
    "TrainConfig",
    "as_yaml",
    "count_plan",
    "keep_percent",
    "load_config",
    "load_platform",
    "merge",
    "parse_overrides",
    "parse_plan_name",
    "read_yaml",
    "validate",
]
