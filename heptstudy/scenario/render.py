"""Launching a resolved scenario: the exact launch command per launcher (local, torchrun, Slurm)
and the files ``heptstudy scenario render`` writes (resolved configurations, launch scripts)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from heptstudy.atomic import atomic_write_text
from heptstudy.config import PlatformConfig
from heptstudy.errors import ConfigError
from heptstudy.scenario.resolve import Resolution, ResolvedVariant, resolve

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


def shell_join(cmd: Sequence[str]) -> str:
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
        shell_join(v.launch),
        "",
    ]
    return "\n".join(lines)


def local_script(res: Resolution, v: ResolvedVariant, workdir: Path) -> str:
    return (
        f"#!/bin/bash\n# scenario {res.scenario.name}, variant {v.name}, platform "
        f"{res.platform.name}\nset -eo pipefail\ncd {shlex.quote(str(workdir))}\n"
        f"{shell_join(v.launch)}\n"
    )


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
        atomic_write_text(v.config_path, v.config.to_yaml())
        v.launch = launch_command(res.platform, v.config_path, resume)
        if res.platform.launcher == "slurm":
            script = out / f"{v.name}.sbatch"
            atomic_write_text(script, slurm_script(res, v, workdir, out))
        else:
            script = out / f"{v.name}.sh"
            atomic_write_text(script, local_script(res, v, workdir))
        scripts.append(script)
    atomic_write_text(out / "resolution.json", json.dumps(res.to_dict(), indent=2) + "\n")
    atomic_write_text(out / "launch_scripts.txt", "".join(f"{s}\n" for s in scripts))
    return res, scripts
