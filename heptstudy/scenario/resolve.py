"""A scenario on a platform: one validated configuration per variant, its derived quantities
(world size, per-device batch, validation and checkpoint steps) and their summary. Layers:
schema defaults <- ``shared`` <- variant <- ``--set`` <- the platform's ``dtype`` and
``attention_backend``, refused where the recipe sets another (a profile never silently changes
the recipe). Each variant writes into ``<train.out_dir>/<scenario>/<variant>``."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf.errors import OmegaConfBaseException

from heptstudy.config import Config, PlatformConfig, merge, parse_overrides, validate
from heptstudy.errors import ConfigError
from heptstudy.paths import resolve_from_cwd, resolve_in_repo
from heptstudy.scenario import rules
from heptstudy.scenario.model import Scenario, find_platform, load_scenario
from heptstudy.scenario.rules import RULES, TestSplit


@dataclass
class ResolvedVariant:
    name: str
    config: Config
    world_size: int
    nodes: int
    devices_per_node: int
    per_device_batch: int
    grad_accumulation: int
    event_presentations: int
    val_steps: list[int]
    checkpoint_steps: list[int]
    dtype: str
    attention_backend: str
    test_split: TestSplit
    config_path: Path | None = None
    launch: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "world_size": self.world_size,
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "global_batch_size": self.config.train.global_batch_size,
            "per_device_batch": self.per_device_batch,
            "grad_accumulation": self.grad_accumulation,
            "num_steps": self.config.train.num_steps,
            "event_presentations": self.event_presentations,
            "val_steps": self.val_steps,
            "checkpoint_steps": self.checkpoint_steps,
            "dtype": self.dtype,
            "attention_backend": self.attention_backend,
            "test_split_events": self.test_split.events,
            "test_split_source": self.test_split.source,
            "out_dir": self.config.train.out_dir,
            "config_path": str(self.config_path) if self.config_path else None,
            "launch": shlex.join(self.launch) if self.launch else None,
            "config": self.config.to_dict(),
        }


@dataclass
class Resolution:
    scenario: Scenario
    platform: PlatformConfig
    platform_path: Path
    variants: list[ResolvedVariant]

    def variant(self, name: str) -> ResolvedVariant:
        return next(v for v in self.variants if v.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            "scenario_path": str(self.scenario.path),
            "description": self.scenario.description,
            "platform": self.platform.name,
            "platform_path": str(self.platform_path),
            "rules_checked": list(RULES),
            "variants": {v.name: v.to_dict() for v in self.variants},
        }


def _resolve_one(
    scenario: Scenario, variant: str, platform: PlatformConfig, overrides: Mapping[str, Any]
) -> Config:
    try:
        recipe = merge(scenario.shared, scenario.variants[variant], overrides)
    except OmegaConfBaseException as err:
        raise ConfigError(
            f"could not merge scenario {scenario.name!r}, variant {variant!r}: {err}"
        ) from None
    for pfield, key in rules.PLATFORM_KEYS.items():
        wanted, given = getattr(platform, pfield), rules.get_dotted(recipe, key)
        if given is not None and given != wanted:
            raise rules.ScenarioError(
                "platform-keeps-recipe",
                f"scenario {scenario.name!r} variant {variant!r} sets {key}={given!r}, but "
                f"platform {platform.name!r} runs with {pfield}={wanted!r}; a profile never "
                f"changes the recipe, so remove {key} from the scenario or --set, or pick a "
                f"platform whose {pfield} is {given!r}",
            )
        rules.set_dotted(recipe, key, wanted)
    # reader threads belong to the node, not the science: the profile only gives a default
    if rules.get_dotted(recipe, "data.num_workers") is None:
        rules.set_dotted(recipe, "data.num_workers", platform.data_workers)
    _out_dir_per_variant(recipe, scenario.name, variant)
    config = validate(
        merge(Config().to_dict(), recipe), f"scenario {scenario.name!r} variant {variant!r}"
    )
    # the folder the run reads, as heptstudy.paths says: typed on the command line, from the
    # working directory; written in a configuration file (or the default), from the repository
    typed = rules.get_dotted(overrides, "data.data_dir") is not None
    where = resolve_from_cwd if typed else resolve_in_repo
    config.data.data_dir = str(where(config.data.data_dir))
    return config


def _out_dir_per_variant(recipe: dict[str, Any], scenario: str, variant: str) -> None:
    """``train.out_dir`` (the default unless given) made ``<out_dir>/<scenario>/<variant>``; a
    given empty, null or non-text one is left for the validation to refuse by its own value."""
    train = recipe.get("train", {})
    if not isinstance(train, Mapping):
        return
    root = train["out_dir"] if "out_dir" in train else Config().train.out_dir
    if isinstance(root, str) and root.strip():
        rules.set_dotted(recipe, "train.out_dir", str(Path(root) / scenario / variant))


def resolve(
    scenario: str | Path,
    platform: str | Path,
    variants: Sequence[str] | None = None,
    overrides: Iterable[str] = (),
    variant_overrides: Mapping[str, Iterable[str]] | None = None,
) -> Resolution:
    """Resolve every variant, check all rules, return the requested ``variants`` (default all);
    ``variant_overrides`` (name -> overrides) apply after ``overrides``, to that variant only."""
    sc = load_scenario(scenario)
    plat, plat_path = find_platform(platform)
    shared, extra = list(overrides), variant_overrides or {}
    for name in [*(variants or ()), *extra]:
        if name not in sc.variants:
            raise rules.ScenarioError(
                "variant-exists",
                f"variant {name!r} is not in scenario {sc.name!r}; its variants are "
                f"{list(sc.variants)}",
            )
    wanted = list(variants) if variants else list(sc.variants)
    # the requested variants first: a refusal names the one asked about when it applies to it
    configs = {
        name: _resolve_one(sc, name, plat, parse_overrides([*shared, *extra.get(name, ())]))
        for name in sorted(sc.variants, key=lambda name: name not in wanted)
    }
    rules.check_shared_budget(sc.name, configs)
    resolved = {}
    given_data_dir = any(str(o).split("=", 1)[0].strip() == "data.data_dir" for o in shared)
    for name, cfg in configs.items():
        split = rules.check_variant(sc.name, name, cfg, plat, sc.test_split_events, given_data_dir)
        t = cfg.train
        resolved[name] = ResolvedVariant(
            name=name,
            config=cfg,
            world_size=plat.world_size,
            nodes=plat.nodes,
            devices_per_node=plat.devices_per_node,
            per_device_batch=t.global_batch_size // (plat.world_size * t.grad_accumulation),
            grad_accumulation=t.grad_accumulation,
            event_presentations=t.global_batch_size * t.num_steps,
            val_steps=list(range(t.val_freq, t.num_steps + 1, t.val_freq)),
            checkpoint_steps=list(range(t.checkpoint_freq, t.num_steps + 1, t.checkpoint_freq)),
            dtype=t.dtype,
            attention_backend=cfg.model.heptv2.attention_backend,
            test_split=split,
        )
    return Resolution(
        scenario=sc,
        platform=plat,
        platform_path=plat_path,
        variants=[resolved[name] for name in sc.variants if name in wanted],
    )


def _steps_text(steps: list[int], freq: int) -> str:
    if len(steps) <= 12:
        body = ", ".join(f"{s:,}" for s in steps)
    else:
        body = f"{steps[0]:,}, {steps[1]:,}, ..., {steps[-1]:,}"
    return f"{body} (every {freq:,}; {len(steps)} in all)"


def summary(res: Resolution) -> str:
    p = res.platform
    lines = [
        f"scenario {res.scenario.name} ({res.scenario.path})",
        f"platform {p.name} ({res.platform_path}): {p.nodes} node(s) x {p.devices_per_node} "
        f"{p.device} device(s), {p.device_memory_gib:g} GiB each, launcher {p.launcher}",
    ]
    for v in res.variants:
        t, d = v.config.train, v.config.data
        rows = [
            ("world size", f"{v.world_size} ({v.nodes} node(s) x {v.devices_per_node})"),
            ("global batch", f"{t.global_batch_size:,} events"),
            ("per-device batch", f"{v.per_device_batch} events per device"),
            ("grad accumulation", str(v.grad_accumulation)),
            ("optimizer steps", f"{t.num_steps:,}"),
            ("event presentations", f"{v.event_presentations:,}"),
            ("validation steps", _steps_text(v.val_steps, t.val_freq)),
            ("checkpoint steps", _steps_text(v.checkpoint_steps, t.checkpoint_freq)),
            ("dtype", f"{v.dtype} (from platform)"),
            ("attention backend", f"{v.attention_backend} (from platform)"),
            ("activation ckpt", str(v.config.model.heptv2.activation_checkpointing).lower()),
            (
                "optimizer",
                f"{t.optimizer}, lr {t.lr:g}, weight decay {t.weight_decay:g}, "
                f"cosine to {t.lr_final_fraction:g} x lr, seed {t.seed}",
            ),
            (
                "data",
                f"{d.dataset} configs {d.configs} in {d.data_dir}, sampler {d.sampler}, "
                f"pad to {d.pad_to_multiple}, {d.num_workers} reader threads and "
                f"{d.prefetch_batches} batches read ahead per rank",
            ),
            (
                "evaluation",
                f"nvalid {d.nvalid} + ntest {d.ntest} of {v.test_split.events:,} test "
                f"events ({v.test_split.source})",
            ),
            ("out dir", t.out_dir),
        ]
        lines.append(f"variant {v.name} (model.variant {v.config.model.variant})")
        lines += [f"  {k:<20} {val}" for k, val in rows]
    lines.append(f"invariants passed: {', '.join(RULES)}")
    return "\n".join(lines)
