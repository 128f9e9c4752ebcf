"""The named invariants every scenario resolution checks, and the error that names a broken one:
a scenario that breaks a rule is refused, never "fixed"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heptstudy.config import Config, PlatformConfig, as_yaml
from heptstudy.data.tfds import open_dataset
from heptstudy.errors import ConfigError

#: Rule name -> what it demands. Every message of a refused resolution starts with its name.
RULES: dict[str, str] = {
    "scenario-exists": "the scenario file exists and holds name, description, shared and variants",
    "platform-exists": "the platform profile exists and validates",
    "variant-exists": "a requested variant is one of the scenario's variants",
    "platform-keeps-recipe": "the platform's dtype and attention backend do not contradict the recipe",
    "batch-divides-devices": "global batch = per-device batch x world size x accumulation steps",
    "shared-budget": "all variants share the optimisation budget and the evaluation sizes",
    "frequencies-divide-steps": "train.val_freq and train.checkpoint_freq divide train.num_steps",
    "eval-within-test-split": "data.nvalid + data.ntest <= events in the test split",
    "data-dir-exists": "a data.data_dir given on the command line (--data-dir, --set) exists",
}

#: Keys that every variant of a scenario must have equal (the optimisation budget and evaluation).
BUDGET_KEYS = tuple(
    "train.global_batch_size train.grad_accumulation train.num_steps train.seed train.optimizer "
    "train.lr train.weight_decay train.lamb train.lr_final_fraction train.val_freq "
    "train.checkpoint_freq data.nvalid data.ntest data.sampler data.pad_to_multiple".split()
)

#: Platform field -> configuration key it sets at resolution.
PLATFORM_KEYS = {"dtype": "train.dtype", "attention_backend": "model.heptv2.attention_backend"}


class ScenarioError(ConfigError):
    """A scenario, platform or override combination broke a named rule."""

    def __init__(self, rule: str, message: str):
        self.rule = rule
        super().__init__(f"[rule {rule}] {message}")


def get_dotted(data: Mapping[str, Any], dotted: str) -> Any:
    """``data[a][b][c]`` for ``"a.b.c"``; None when any level is missing."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = data
    for depth, part in enumerate(parents, 1):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):  # `--set train=5`: no key can be set inside it
            section = ".".join(parents[:depth])
            raise ConfigError(
                f"{section}={as_yaml(node)} is not allowed: {section} is a section of keys, "
                f"not a value; set its keys one by one, e.g. --set {section}.KEY=VALUE"
            )
    node[last] = value


def check_shared_budget(scenario: str, configs: Mapping[str, Config]) -> None:
    """All variants equal on :data:`BUDGET_KEYS`."""
    dicts = {name: cfg.to_dict() for name, cfg in configs.items()}
    first, first_dict = next(iter(dicts.items()))
    for name, data in dicts.items():
        for key in BUDGET_KEYS:
            a, b = get_dotted(first_dict, key), get_dotted(data, key)
            if a != b:
                raise ScenarioError(
                    "shared-budget",
                    f"scenario {scenario!r}: {key} is {a!r} in variant {first!r} but {b!r} in "
                    f"variant {name!r}; the variants are compared on one optimisation budget, so "
                    f"set {key} once under 'shared' (keys that must match: {list(BUDGET_KEYS)})",
                )


@dataclass
class TestSplit:
    events: int
    source: str


def test_split_size(cfg: Config, declared: Mapping[str, int]) -> TestSplit | None:
    """Events in the test split: counted in its files when every config has TFDS metadata (which
    alone could claim any number), else the scenario's declared number, else None."""
    d = cfg.data
    infos = [Path(d.data_dir) / d.name / c / d.version / "dataset_info.json" for c in d.configs]
    if all(info.is_file() for info in infos):
        events = len(open_dataset(d.data_dir, d.dataset, d.configs, "test"))
        return TestSplit(events, "metadata " + ", ".join(map(str, infos)) + ", files counted")
    for key in (d.dataset, d.name):
        if key in declared:
            return TestSplit(declared[key], f"scenario test_split_events[{key!r}] (declared)")
    return None


def check_variant(
    scenario: str,
    variant: str,
    cfg: Config,
    platform: PlatformConfig,
    declared: Mapping[str, int],
    given_data_dir: bool,
) -> TestSplit:
    """The rules of one resolved variant; the test split's size (``declared``: the scenario's
    test_split_events), once ``data.nvalid + data.ntest`` is known to fit in it."""
    where, t, d = f"scenario {scenario!r} variant {variant!r}", cfg.train, cfg.data
    # a mistyped data directory would read as "no metadata", passing on declared numbers
    if given_data_dir and not Path(d.data_dir).is_dir():
        raise ScenarioError(
            "data-dir-exists",
            f"scenario {scenario}, variant {variant}: data.data_dir={d.data_dir!r} (given on the "
            "command line) does not exist; give the folder holding the data set (heptstudy data "
            "generate --data-dir DIR makes a synthetic one), or leave it out",
        )
    world = platform.world_size
    if t.global_batch_size % (world * t.grad_accumulation):
        raise ScenarioError(
            "batch-divides-devices",
            f"{where}: train.global_batch_size={t.global_batch_size} does not divide over world "
            f"size {world} ({platform.nodes} node(s) x {platform.devices_per_node} devices of "
            f"{platform.name!r}) x train.grad_accumulation={t.grad_accumulation} = "
            f"{world * t.grad_accumulation}; choose a global batch that is a multiple of that "
            "product",
        )
    for key in ("val_freq", "checkpoint_freq"):
        if t.num_steps % (freq := getattr(t, key)):
            raise ScenarioError(
                "frequencies-divide-steps",
                f"{where}: train.{key}={freq} does not divide train.num_steps={t.num_steps}, so "
                "the last step would not be validated and checkpointed; choose a divisor of "
                f"{t.num_steps} or change num_steps",
            )
    split = test_split_size(cfg, declared)
    if split is None:
        raise ScenarioError(
            "eval-within-test-split",
            f"{where}: the test split size of {d.dataset} configs {d.configs} is unknown: no "
            f"dataset_info.json under data.data_dir={d.data_dir!r} and no test_split_events "
            f"entry for {d.name!r}; pass --data-dir with the data set or declare "
            "test_split_events in the scenario",
        )
    if (need := d.nvalid + d.ntest) > split.events:
        raise ScenarioError(
            "eval-within-test-split",
            f"{where}: data.nvalid={d.nvalid} + data.ntest={d.ntest} = {need} exceeds the "
            f"{split.events} events of the test split of {d.dataset} ({split.source}); resolve "
            "against the data set the run will read (--data-dir DIR, e.g. the cluster's TFDS "
            "directory), or lower nvalid/ntest for a smaller one",
        )
    return split
