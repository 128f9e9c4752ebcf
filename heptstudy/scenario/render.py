"""Launching a resolved scenario: the exact launch command per launcher (local, torchrun, Slurm)
and the files ``heptstudy scenario render`` writes (resolved configurations, launch scripts)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from heptstudy.atomic import atomic_write_text, folder_write_problem
from heptstudy.config import PlatformConfig
from heptstudy.errors import ConfigError
from heptstudy.locks import holding
from heptstudy.names import inside
from heptstudy.paths import real_path
from heptstudy.scenario.resolve import Resolution, ResolvedVariant, resolve

#: How a launched job calls the trainer (torchrun runs the module with the environment's Python).
LOCAL_TRAIN = ["heptstudy", "train"]
MODULE_TRAIN = ["-m", "heptstudy.cli", "train"]


class Expand(str):
    """A launch-command word the job's shell is meant to expand (``${SLURM_JOB_ID}``)."""


def launch_command(
    platform: PlatformConfig, config_path: str | Path, resume: str | None = None
) -> list[str]:
    tail = ["--config", str(config_path)] + (["--resume", resume] if resume else [])
    if platform.launcher == "local":
        return [*LOCAL_TRAIN, *tail]
    sizes = ["--nnodes", str(platform.nodes), "--nproc-per-node", str(platform.devices_per_node)]
    if platform.launcher == "torchrun":
        return ["torchrun", "--standalone", *sizes, *MODULE_TRAIN, *tail]
    srun = ["srun", "--ntasks-per-node=1", f"--cpus-per-task={platform.cpus_per_task}"]
    rdzv = ["--rdzv-id", Expand("${SLURM_JOB_ID}"), "--rdzv-backend", "c10d", "--rdzv-endpoint"]
    rdzv.append(Expand("${MASTER_ADDR}:${MASTER_PORT}"))
    return [*srun, "torchrun", *sizes, *rdzv, *MODULE_TRAIN, *tail]


def shell_join(cmd: Sequence[str]) -> str:
    """Quote for bash: every word literally, but the launch command's own :class:`Expand` words."""
    return " ".join(f'"{c}"' if isinstance(c, Expand) else shlex.quote(c) for c in cmd)


def env_value(text: str) -> str:
    """A platform ``env`` value for bash: ``${NAME}`` references expand in the job's shell; every
    other ``$``, backtick, quote and backslash is escaped, so no shell text of a profile runs."""
    parts = re.split(r"(\$\{[A-Za-z_][A-Za-z0-9_]*\})", text)  # odd ones: the ${NAME}s
    escaped = (p if i % 2 else re.sub(r'([\\"`$])', r"\\\1", p) for i, p in enumerate(parts))
    return '"' + "".join(escaped) + '"'


def _comment(text: str) -> str:
    """A comment line: line breaks shown as ``\\n`` so that no text becomes a command."""
    return "# " + "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def slurm_script(res: Resolution, v: ResolvedVariant, workdir: Path, log_dir: Path) -> str:
    # a line break in a directive's value would start a shell command: every value here is
    # checked to be one line (the profile's fields, the names, the render folder)
    p = res.platform
    sbatch = {
        "job-name": f"{res.scenario.name[:40]}-{v.name[:40]}",
        "nodes": p.nodes,
        "ntasks-per-node": 1,
        "gpus-per-node": p.devices_per_node,
        "cpus-per-task": p.cpus_per_task,
        "mem": f"{p.host_memory_gib:g}G" if p.host_memory_gib > 0 else "0",
        "time": p.time_limit,
        "partition": p.partition,
        "account": p.account,
        "output": f"{log_dir}/slurm-{v.name}-%j.out",
    }
    lines = ["#!/bin/bash"] + [f"#SBATCH --{k}={x}" for k, x in sbatch.items() if x != ""]
    lines += [
        "",
        _comment(
            f"Rendered by `heptstudy scenario render`: scenario {res.scenario.name}, "
            f"variant {v.name},"
        ),
        _comment(
            f"platform {p.name} ({res.platform_path}). Resolved configuration: {v.config_path}"
        ),
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
    lines += [f"export {key}={env_value(value)}" for key, value in p.env.items()]
    lines += [
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "export MASTER_ADDR",
        "export MASTER_PORT=29500",
        f"mkdir -p {shlex.quote(v.config.train.out_dir)}",
        "echo "
        + shlex.quote(
            f"scenario {res.scenario.name} variant {v.name}: per-device batch "
            f"{v.per_device_batch} on {v.world_size} devices"
        ),
        shell_join(v.launch),
        "",
    ]
    return "\n".join(lines)


def local_script(res: Resolution, v: ResolvedVariant, workdir: Path) -> str:
    head = _comment(f"scenario {res.scenario.name}, variant {v.name}, platform {res.platform.name}")
    return (
        f"#!/bin/bash\n{head}\nset -eo pipefail\ncd {shlex.quote(str(workdir))}\n"
        f"{shell_join(v.launch)}\n"
    )


def render(
    scenario: str | Path,
    platform: str | Path,
    out: str | Path | None,
    variants: Sequence[str] | None = None,
    overrides: Iterable[str] = (),
    resume: str | None = None,
    workdir: str | Path | None = None,
) -> tuple[Resolution, list[Path]]:
    """Resolve, then write each variant's configuration and launch script, ``resolution.json`` and
    ``launch_scripts.txt`` into ``out`` (else experiments/train/_rendered/SCENARIO/PLATFORM)."""
    res = resolve(scenario, platform, variants, overrides)
    out = out or Path("experiments/train/_rendered") / res.scenario.name / res.platform.name
    out = real_path(out, "render folder (--out / --render-dir)")
    if not str(out).isprintable():
        raise ConfigError(
            f"render folder {str(out)!r} holds a line break or control character; the launch "
            "scripts list it one path a line: choose a plain folder name"
        )
    if (problem := folder_write_problem(out, create=True)) is not None:
        raise ConfigError(
            f"cannot write the rendered files to {str(out)!r}: {problem}; nothing was rendered. "
            "Choose a writable folder (--out / --render-dir) or fix its permissions"
        )
    workdir = real_path(workdir or Path.cwd(), "working directory")
    texts: list[tuple[Path, str]] = []
    scripts = []
    slurm = res.platform.launcher == "slurm"
    for v in res.variants:
        v.config_path = inside(out, f"{v.name}.yaml", f"variant {v.name!r}: configuration")
        v.launch = launch_command(res.platform, v.config_path, resume)
        name, kind = (f"{v.name}.sbatch", "batch") if slurm else (f"{v.name}.sh", "launch")
        script = inside(out, name, f"variant {v.name!r}: {kind} script")
        text = slurm_script(res, v, workdir, out) if slurm else local_script(res, v, workdir)
        texts += [(v.config_path, v.config.to_yaml()), (script, text)]
        scripts.append(script)
    # every script is rendered (and refused) before the first file is written
    with holding(out, "render folder (--out / --render-dir)"):
        for path, text in texts:
            atomic_write_text(path, text)
        atomic_write_text(out / "resolution.json", json.dumps(res.to_dict(), indent=2) + "\n")
        atomic_write_text(out / "launch_scripts.txt", "".join(f"{s}\n" for s in scripts))
    return res, scripts
