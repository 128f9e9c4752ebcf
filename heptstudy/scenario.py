"""Training scenarios and platform profiles: resolution, invariant checks and launch rendering.

A *scenario* (``configs/training/scenarios/NAME.yaml``) holds the science: a ``shared`` partial
configuration and one partial configuration per ``variants`` entry. A *platform profile*
(``configs/training/platforms/NAME.yaml``, :class:`heptstudy.config.PlatformConfig`) holds the
hardware and runtime: devices, memory, dtype, attention backend, launcher, Slurm settings.

Resolution layers, per variant: schema defaults <- ``shared`` <- the variant <- ``--set``
overrides <- the platform's ``dtype`` (``train.dtype``) and ``attention_backend``
(``model.heptv2.attention_backend``). If the scenario or an override already sets one of those two
keys to another value, resolution is refused: a profile never silently changes the recipe.
Each variant writes into ``<train.out_dir>/<scenario>/<variant>``: the scenario's
``train.out_dir`` is a root shared by the variants.

Every resolution checks the rules in :data:`RULES`; a scenario that breaks one is refused with a
:class:`ScenarioError` whose message starts with ``[rule NAME]``, never "fixed".

The test-split size used by ``eval-within-test-split`` comes from the data set's TFDS metadata
(``DATA_DIR/NAME/CONFIG/VERSION/dataset_info.json``, summed over ``data.configs``) when it is
there, otherwise from the scenario's top-level ``test_split_events`` mapping
(``{dataset NAME or NAME:VERSION: events}``), which is a declared number, not a measured one.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf.errors import OmegaConfBaseException

from heptstudy.config import (
    Config,
    PlatformConfig,
    _parse_overrides,
    _read_yaml,
    load_platform,
    merge,
    validate,
)
from heptstudy.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
SCENARIO_DIR = REPO_ROOT / "configs" / "training" / "scenarios"
PLATFORM_DIR = REPO_ROOT / "configs" / "training" / "platforms"

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
}

#: Keys that every variant of a scenario must have equal (the optimisation budget and evaluation).
BUDGET_KEYS = (
    "train.global_batch_size",
    "train.grad_accumulation",
    "train.num_steps",
    "train.seed",
    "train.optimizer",
    "train.lr",
    "train.weight_decay",
    "train.lr_final_fraction",
    "train.val_freq",
    "train.checkpoint_freq",
    "data.nvalid",
    "data.ntest",
    "data.sampler",
    "data.pad_to_multiple",
)

#: Platform field -> configuration key it sets at resolution.
PLATFORM_KEYS = {"dtype": "train.dtype", "attention_backend": "model.heptv2.attention_backend"}

_SCENARIO_KEYS = {"name", "description", "shared", "variants", "test_split_events"}


class ScenarioError(ConfigError):
    """A scenario, platform or override combination broke a named rule."""

    def __init__(self, rule: str, message: str):
        self.rule = rule
        super().__init__(f"[rule {rule}] {message}")


# --------------------------------------------------------------------------- loading


@dataclass
class Scenario:
    name: str
    description: str
    shared: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    test_split_events: dict[str, int]
    path: Path


def find_file(name_or_path: str | Path, directory: Path) -> Path | None:
    """A path as given, else for a bare name ``directory/NAME`` or ``directory/NAME.yaml``; None if
    none exists."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.parent == Path("."):
        for candidate in (directory / p.name, directory / f"{p.name}.yaml"):
            if candidate.is_file():
                return candidate
    return None


def load_scenario(name_or_path: str | Path) -> Scenario:
    path = find_file(name_or_path, SCENARIO_DIR)
    if path is None:
        known = sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
        raise ScenarioError(
            "scenario-exists",
            f"scenario {str(name_or_path)!r} is neither a file nor a name in {SCENARIO_DIR}; "
            f"known scenarios: {known}",
        )
    try:
        data = _read_yaml(path, "scenario")
    except ConfigError as err:
        raise ScenarioError("scenario-exists", str(err)) from None
    unknown = sorted(set(data) - _SCENARIO_KEYS)
    missing = sorted({"name", "shared", "variants"} - set(data))
    if unknown or missing:
        raise ScenarioError(
            "scenario-exists",
            f"scenario {str(path)!r}: unknown top-level keys {unknown}, missing keys {missing}; "
            f"a scenario holds exactly {sorted(_SCENARIO_KEYS)} (model/data/train go under "
            "'shared' or a variant)",
        )
    variants = data["variants"]
    if not isinstance(variants, Mapping) or not variants:
        raise ScenarioError(
            "scenario-exists",
            f"scenario {str(path)!r}: 'variants' must be a non-empty mapping of name -> partial "
            f"configuration, got {variants!r}",
        )
    shared = data.get("shared") or {}
    for where, part in [("shared", shared)] + [(f"variants.{k}", v) for k, v in variants.items()]:
        if part is not None and not isinstance(part, Mapping):
            raise ScenarioError(
                "scenario-exists",
                f"scenario {str(path)!r}: {where} must be a mapping (a partial configuration with "
                f"model/data/train sections), got {part!r}",
            )
    split = data.get("test_split_events") or {}
    if not isinstance(split, Mapping) or not all(
        isinstance(v, int) and v >= 0 for v in split.values()
    ):
        raise ScenarioError(
            "scenario-exists",
            f"scenario {str(path)!r}: test_split_events must map a data set (NAME or NAME:VERSION) "
            f"to a non-negative event count, got {split!r}",
        )
    return Scenario(
        name=str(data["name"]),
        description=str(data.get("description", "")).strip(),
        shared=dict(shared),
        variants={str(k): dict(v or {}) for k, v in variants.items()},
        test_split_events={str(k): int(v) for k, v in split.items()},
        path=path,
    )


def find_platform(name_or_path: str | Path) -> tuple[PlatformConfig, Path]:
    path = find_file(name_or_path, PLATFORM_DIR)
    if path is None:
        known = sorted(p.stem for p in PLATFORM_DIR.glob("*.yaml"))
        raise ScenarioError(
            "platform-exists",
            f"platform profile {str(name_or_path)!r} is neither a file nor a name in "
            f"{PLATFORM_DIR}; known platforms: {known}",
        )
    try:
        return load_platform(path), path
    except ConfigError as err:
        raise ScenarioError("platform-exists", str(err)) from None


# --------------------------------------------------------------------------- resolution


def _get(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


@dataclass
class TestSplit:
    events: int
    source: str


def test_split_size(cfg: Config, declared: Mapping[str, int]) -> TestSplit | None:
    """Events in the test split of ``cfg.data``: TFDS metadata under ``data.data_dir`` summed over
    ``data.configs``, else the scenario's declared number, else None."""
    total, files = 0, []
    for conf in cfg.data.configs:
        info = (
            Path(cfg.data.data_dir) / cfg.data.name / conf / cfg.data.version / "dataset_info.json"
        )
        if not info.is_file():
            break
        try:
            splits = json.loads(info.read_text()).get("splits", [])
            test = next(s for s in splits if s.get("name") == "test")
            total += sum(int(n) for n in test.get("shardLengths", []))
        except (ValueError, StopIteration, AttributeError, TypeError):
            break
        files.append(str(info))
    else:
        return TestSplit(total, "metadata " + ", ".join(files))
    for key in (cfg.data.dataset, cfg.data.name):
        if key in declared:
            return TestSplit(declared[key], f"scenario test_split_events[{key!r}] (declared)")
    return None


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
    rules_checked: list[str]

    def variant(self, name: str) -> ResolvedVariant:
        return next(v for v in self.variants if v.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            "scenario_path": str(self.scenario.path),
            "description": self.scenario.description,
            "platform": self.platform.name,
            "platform_path": str(self.platform_path),
            "rules_checked": self.rules_checked,
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
    for pfield, key in PLATFORM_KEYS.items():
        wanted, given = getattr(platform, pfield), _get(recipe, key)
        if given is not None and given != wanted:
            raise ScenarioError(
                "platform-keeps-recipe",
                f"scenario {scenario.name!r} variant {variant!r} sets {key}={given!r}, but platform "
                f"{platform.name!r} runs with {pfield}={wanted!r}; a profile never changes the "
                f"recipe, so remove {key} from the scenario or --set, or pick a platform whose "
                f"{pfield} is {given!r}",
            )
        _set(recipe, key, wanted)
    root = _get(recipe, "train.out_dir") or Config().train.out_dir
    _set(recipe, "train.out_dir", str(Path(root) / scenario.name / variant))
    return validate(
        merge(Config().to_dict(), recipe), f"scenario {scenario.name!r} variant {variant!r}"
    )


def _steps(freq: int, num_steps: int) -> list[int]:
    return list(range(freq, num_steps + 1, freq))


def resolve(
    scenario: str | Path | Scenario,
    platform: str | Path,
    variants: Sequence[str] | None = None,
    overrides: Iterable[str] = (),
) -> Resolution:
    """Resolve every variant of ``scenario`` on ``platform``, check all rules, return the
    requested ``variants`` (all by default)."""
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    plat, plat_path = find_platform(platform)
    for name in variants or ():
        if name not in sc.variants:
            raise ScenarioError(
                "variant-exists",
                f"variant {name!r} is not in scenario {sc.name!r}; its variants are {list(sc.variants)}",
            )
    parsed = _parse_overrides(list(overrides))
    configs = {name: _resolve_one(sc, name, plat, parsed) for name in sc.variants}

    # shared-budget: all variants equal on BUDGET_KEYS
    first, first_cfg = next(iter(configs.items()))
    for name, cfg in configs.items():
        for key in BUDGET_KEYS:
            a, b = _get(first_cfg.to_dict(), key), _get(cfg.to_dict(), key)
            if a != b:
                raise ScenarioError(
                    "shared-budget",
                    f"scenario {sc.name!r}: {key} is {a!r} in variant {first!r} but {b!r} in "
                    f"variant {name!r}; the variants are compared on one optimisation budget, so "
                    f"set {key} once under 'shared' (keys that must match: {list(BUDGET_KEYS)})",
                )

    resolved = []
    for name, cfg in configs.items():
        t = cfg.train
        world = plat.world_size
        if t.global_batch_size % (world * t.grad_accumulation):
            raise ScenarioError(
                "batch-divides-devices",
                f"scenario {sc.name!r} variant {name!r}: train.global_batch_size="
                f"{t.global_batch_size} does not divide over world size {world} "
                f"({plat.nodes} node(s) x {plat.devices_per_node} devices of {plat.name!r}) x "
                f"train.grad_accumulation={t.grad_accumulation} = {world * t.grad_accumulation}; "
                "choose a global batch that is a multiple of that product",
            )
        for key in ("val_freq", "checkpoint_freq"):
            freq = getattr(t, key)
            if t.num_steps % freq:
                raise ScenarioError(
                    "frequencies-divide-steps",
                    f"scenario {sc.name!r} variant {name!r}: train.{key}={freq} does not divide "
                    f"train.num_steps={t.num_steps}, so the last step would not be validated and "
                    f"checkpointed; choose a divisor of {t.num_steps} or change num_steps",
                )
        split = test_split_size(cfg, sc.test_split_events)
        if split is None:
            raise ScenarioError(
                "eval-within-test-split",
                f"scenario {sc.name!r} variant {name!r}: the test split size of "
                f"{cfg.data.dataset} configs {cfg.data.configs} is unknown: no dataset_info.json "
                f"under data.data_dir={cfg.data.data_dir!r} and no test_split_events entry for "
                f"{cfg.data.name!r}; pass --data-dir with the data set or declare "
                "test_split_events in the scenario",
            )
        need = cfg.data.nvalid + cfg.data.ntest
        if need > split.events:
            raise ScenarioError(
                "eval-within-test-split",
                f"scenario {sc.name!r} variant {name!r}: data.nvalid={cfg.data.nvalid} + "
                f"data.ntest={cfg.data.ntest} = {need} exceeds the {split.events} events of the "
                f"test split of {cfg.data.dataset} ({split.source}); lower nvalid/ntest or use a "
                "larger test split",
            )
        resolved.append(
            ResolvedVariant(
                name=name,
                config=cfg,
                world_size=world,
                nodes=plat.nodes,
                devices_per_node=plat.devices_per_node,
                per_device_batch=t.global_batch_size // (world * t.grad_accumulation),
                grad_accumulation=t.grad_accumulation,
                event_presentations=t.global_batch_size * t.num_steps,
                val_steps=_steps(t.val_freq, t.num_steps),
                checkpoint_steps=_steps(t.checkpoint_freq, t.num_steps),
                dtype=t.dtype,
                attention_backend=cfg.model.heptv2.attention_backend,
                test_split=split,
            )
        )
    wanted = list(variants) if variants else list(sc.variants)
    return Resolution(
        scenario=sc,
        platform=plat,
        platform_path=plat_path,
        variants=[v for v in resolved if v.name in wanted],
        rules_checked=list(RULES),
    )


# --------------------------------------------------------------------------- launching

#: How a launched job calls the trainer (torchrun runs the module with the environment's Python).
LOCAL_TRAIN = ["heptstudy", "train"]
MODULE_TRAIN = ["-m", "heptstudy.cli", "train"]


def launch_command(
    platform: PlatformConfig, config_path: str | Path, resume: str | None = None
) -> list[str]:
    tail = ["--config", str(config_path)] + (["--resume", resume] if resume else [])
    if platform.launcher == "local":
        return [*LOCAL_TRAIN, *tail]
    if platform.launcher == "torchrun":
        return [
            "torchrun",
            "--standalone",
            "--nnodes",
            str(platform.nodes),
            "--nproc-per-node",
            str(platform.devices_per_node),
            *MODULE_TRAIN,
            *tail,
        ]
    return [
        "srun",
        "--ntasks-per-node=1",
        f"--cpus-per-task={platform.cpus_per_task}",
        "torchrun",
        "--nnodes",
        str(platform.nodes),
        "--nproc-per-node",
        str(platform.devices_per_node),
        "--rdzv-id",
        "${SLURM_JOB_ID}",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "${MASTER_ADDR}:${MASTER_PORT}",
        *MODULE_TRAIN,
        *tail,
    ]


def _shell(cmd: Sequence[str]) -> str:
    """Quote for bash, leaving ``${VAR}`` references expandable."""
    return " ".join(f'"{c}"' if "${" in c else shlex.quote(c) for c in cmd)


def slurm_script(res: Resolution, v: ResolvedVariant, workdir: Path, log_dir: Path) -> str:
    p = res.platform
    mem = f"{p.host_memory_gib:g}G" if p.host_memory_gib > 0 else "0"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={res.scenario.name[:40]}-{v.name[:40]}",
        f"#SBATCH --nodes={p.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={p.devices_per_node}",
        f"#SBATCH --cpus-per-task={p.cpus_per_task}",
        f"#SBATCH --mem={mem}",
        f"#SBATCH --time={p.time_limit}",
    ]
    if p.partition:
        lines.append(f"#SBATCH --partition={p.partition}")
    if p.account:
        lines.append(f"#SBATCH --account={p.account}")
    lines += [
        f"#SBATCH --output={log_dir}/slurm-{v.name}-%j.out",
        "",
        f"# Rendered by `heptstudy scenario render`: scenario {res.scenario.name}, variant {v.name},",
        f"# platform {p.name} ({res.platform_path}). Resolved configuration: {v.config_path}",
        f"# world size {v.world_size} ({v.nodes} node(s) x {v.devices_per_node} devices), "
        f"global batch {v.config.train.global_batch_size}, per-device batch {v.per_device_batch}, "
        f"grad accumulation {v.grad_accumulation}",
        f"# {v.config.train.num_steps} steps, {v.event_presentations} event presentations, "
        f"dtype {v.dtype}, attention backend {v.attention_backend}",
        "# Without 'account' in the profile, set SBATCH_ACCOUNT (and SBATCH_PARTITION) before sbatch.",
        "set -eo pipefail",
        f"cd {shlex.quote(str(workdir))}",
    ]
    lines += [f"module load {shlex.quote(m)}" for m in p.modules]
    lines += ["if [ -f .venv/bin/activate ]; then source .venv/bin/activate; fi"]
    for key, value in p.env.items():
        if '"' in value or "`" in value:
            raise ConfigError(
                f"platform {p.name!r} env {key}={value!r}: quotes and backticks are not allowed"
            )
        lines.append(f'export {key}="{value}"')
    lines += [
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "export MASTER_ADDR",
        "export MASTER_PORT=29500",
        f"mkdir -p {shlex.quote(v.config.train.out_dir)}",
        f'echo "scenario {res.scenario.name} variant {v.name}: per-device batch '
        f'{v.per_device_batch} on {v.world_size} devices"',
        _shell(v.launch),
        "",
    ]
    return "\n".join(lines)


def render(
    scenario: str | Path,
    platform: str | Path,
    out: str | Path,
    variants: Sequence[str] | None = None,
    overrides: Iterable[str] = (),
    resume: str | None = None,
    workdir: str | Path | None = None,
) -> tuple[Resolution, list[Path]]:
    """Resolve, then write per variant ``OUT/VARIANT.yaml`` (the resolved configuration) and a
    launch script (``VARIANT.sbatch`` for Slurm profiles, ``VARIANT.sh`` otherwise), plus
    ``OUT/resolution.json`` and ``OUT/launch_scripts.txt`` (the scripts, one a line)."""
    res = resolve(scenario, platform, variants, overrides)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(workdir or Path.cwd()).resolve()
    scripts = []
    for v in res.variants:
        v.config_path = out / f"{v.name}.yaml"
        v.config_path.write_text(v.config.to_yaml())
        v.launch = launch_command(res.platform, v.config_path, resume)
        if res.platform.launcher == "slurm":
            script = out / f"{v.name}.sbatch"
            script.write_text(slurm_script(res, v, workdir, out))
        else:
            script = out / f"{v.name}.sh"
            script.write_text(
                f"#!/bin/bash\n# scenario {res.scenario.name}, variant {v.name}, platform "
                f"{res.platform.name}\nset -eo pipefail\ncd {shlex.quote(str(workdir))}\n"
                f"{_shell(v.launch)}\n"
            )
        scripts.append(script)
    (out / "resolution.json").write_text(json.dumps(res.to_dict(), indent=2) + "\n")
    (out / "launch_scripts.txt").write_text("".join(f"{s}\n" for s in scripts))
    return res, scripts


# --------------------------------------------------------------------------- text output


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
                f"pad to {d.pad_to_multiple}",
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
    lines.append(f"invariants passed: {', '.join(res.rules_checked)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario", required=True, help="scenario YAML, or a name in configs/training/scenarios"
    )
    p.add_argument(
        "--platform", required=True, help="platform YAML, or a name in configs/training/platforms"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="NAME",
        help="resolve only this variant (repeatable; all are still checked)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override applied to every variant, e.g. train.num_steps=4",
    )
    p.add_argument(
        "--data-dir",
        help="shorthand for --set data.data_dir=DIR (also where the test-split size is read from)",
    )
    p.add_argument("--resume", metavar="PATH", help="append --resume PATH to the launch commands")
    p.add_argument("--json", action="store_true", help="print the resolution as JSON")


def _overrides(args: argparse.Namespace) -> list[str]:
    return list(args.overrides) + ([f"data.data_dir={args.data_dir}"] if args.data_dir else [])


def _cmd_resolve(args: argparse.Namespace) -> int:
    if args.dry_run:
        out = args.render_dir
        if out is None:
            sc = load_scenario(args.scenario)
            plat, _ = find_platform(args.platform)
            out = Path("experiments/train/_rendered") / sc.name / plat.name
        res, scripts = render(
            args.scenario, args.platform, out, args.variant, _overrides(args), args.resume
        )
    else:
        res = resolve(args.scenario, args.platform, args.variant, _overrides(args))
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
        return 0
    print(summary(res))
    from heptstudy.fitting.cli import fit_warning

    warning = fit_warning(res)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print("dry run: nothing was launched; the launch commands are")
        for v in res.variants:
            print(f"# {v.name} (configuration {v.config_path})")
            print(_shell(v.launch))
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    res, scripts = render(
        args.scenario, args.platform, args.out, args.variant, _overrides(args), args.resume
    )
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
        return 0
    print(summary(res))
    for v, s in zip(res.variants, scripts, strict=True):
        print(f"rendered {v.name}: configuration {v.config_path}, launch script {s}")
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    sc = subparsers.add_parser(
        "scenario", help="training scenarios: resolve, check, render launches"
    )
    sub = sc.add_subparsers(dest="scenario_command", required=True)
    r = sub.add_parser("resolve", help="resolve a scenario on a platform and check its invariants")
    _add_common(r)
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="also write the resolved configurations and print the exact launch commands",
    )
    r.add_argument(
        "--render-dir",
        type=Path,
        default=None,
        help="where --dry-run writes configurations (default experiments/train/_rendered/SCENARIO/PLATFORM)",
    )
    r.set_defaults(func=_cmd_resolve)
    w = sub.add_parser(
        "render",
        help="write resolved configurations and launch scripts (Slurm batch "
        "scripts for Slurm profiles) into --out",
    )
    _add_common(w)
    w.add_argument("--out", required=True, type=Path, help="directory for the rendered files")
    w.set_defaults(func=_cmd_render)


def main(argv: list[str] | None = None) -> int:
    """``python -m heptstudy.scenario resolve|render ...``: the scenario commands alone, without
    importing the rest of the package's CLI areas."""
    from heptstudy.errors import HeptstudyError

    parser = argparse.ArgumentParser(prog="heptstudy")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["scenario", *(argv if argv is not None else sys.argv[1:])])
    try:
        return int(args.func(args) or 0)
    except HeptstudyError as err:
        print(f"heptstudy: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "BUDGET_KEYS",
    "RULES",
    "Resolution",
    "ResolvedVariant",
    "Scenario",
    "ScenarioError",
    "find_platform",
    "launch_command",
    "load_scenario",
    "register_cli",
    "render",
    "resolve",
    "summary",
]
