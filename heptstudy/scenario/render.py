"""Launching a resolved scenario: the exact launch command per launcher (local, torchrun, Slurm)
and the files ``heptstudy scenario render`` writes (resolved configurations, launch scripts)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from heptstudy.atomic import Output, folder_write_problem, write_output_files
from heptstudy.config import PlatformConfig
from heptstudy.errors import ConfigError
from heptstudy.locks import holding
from heptstudy.names import inside
from heptstudy.paths import OUTPUT_ROOT, real_path
from heptstudy.scenario.resolve import Resolution, ResolvedVariant, resolve

#: What every rendered configuration and launch script says of itself; a file in the render
#: folder without it (a configuration of the user's own) is never replaced.
RENDERED = "Rendered by `heptstudy scenario render`"
CONFIG_FILE = Output("configuration rendered by heptstudy", ".yaml", RENDERED.encode())
RESOLUTION_SCHEMA = "heptstudy.scenario_resolution/1"
RESOLUTION_FILE = Output(
    "heptstudy scenario resolution", ".json", f'"schema": "{RESOLUTION_SCHEMA}"'.encode()
)
#: The list stays one script path a line (scripts/lib/submit_scenario.sh runs every line), so it
#: is recognised by that form: absolute paths of launch scripts, nothing else.
SCRIPT_LIST = Output(
    "heptstudy launch-script list", ".txt", re.compile(rb"(?:/[^\n]*\.(?:sh|sbatch)\n)+")
)


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
        _comment(f"{RENDERED}: scenario {res.scenario.name}, variant {v.name},"),
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


def _rendered_head(res: Resolution, v: ResolvedVariant) -> str:
    return _comment(
        f"{RENDERED}: scenario {res.scenario.name}, variant {v.name}, platform {res.platform.name}"
    )


def local_script(res: Resolution, v: ResolvedVariant, workdir: Path) -> str:
    return (
        f"#!/bin/bash\n{_rendered_head(res, v)}\nset -eo pipefail\n"
        f"cd {shlex.quote(str(workdir))}\n{shell_join(v.launch)}\n"
    )


#: The suffix of the training-state files `heptstudy train` writes (checkpoints/step_NNNNNN.pt).
CHECKPOINT_SUFFIX = ".pt"


def checked_resume(resume: str | None, res: Resolution, workdir: Path) -> str | None:
    """``--resume`` as given, once it names a file (from ``workdir``, where the launch runs)
    and the render has a single variant."""
    if resume is None:
        return None
    names = [v.name for v in res.variants]
    # A checkpoint is one variant's training state (its model, optimizer, data position). Put in
    # every variant's launch, it would start the others from a model they never trained, or be
    # refused only when the job starts, after its queue wait. No variant's own checkpoint can be
    # told from one path, so one path resumes one variant, chosen with --variant.
    if len(names) > 1:
        raise ConfigError(
            f"--resume {resume!r} names one checkpoint, but {len(names)} variants are rendered "
            f"({', '.join(names)}) and a checkpoint is the training state of one of them; nothing "
            f"was rendered. Render the variant it belongs to alone: --variant NAME --resume "
            f"{resume} (one render per variant to resume)"
        )
    path = workdir / Path(resume).expanduser()  # as the launch script reads it, after its cd
    wanted = (
        f"Give the training-state file variant {names[0]} resumes from, one of the "
        "step_NNNNNN.pt files in its train.out_dir's checkpoints/ folder"
    )
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no file (it does not exist)"
        raise ConfigError(f"--resume {resume!r} ({path}) is {what}; nothing was rendered. {wanted}")
    # `heptstudy train` names every training state *.pt; another file (a log, a configuration)
    # would be refused only when the job starts, after its queue wait. Reading it to be sure
    # would need torch and the whole file: the name is the cheap check
    if path.suffix != CHECKPOINT_SUFFIX:
        ends = f"ends in {path.suffix!r}" if path.suffix else "has no suffix"
        raise ConfigError(
            f"--resume {resume!r} ({path}) is not a training-state file: `heptstudy train` "
            f"writes those as step_NNNNNN{CHECKPOINT_SUFFIX}, and this one {ends}; nothing was "
            f"rendered. {wanted} (a copy of one under another name: give it back its "
            f"{CHECKPOINT_SUFFIX} suffix)"
        )
    return resume


def refuse_empty_path(value: str | Path | None, option: str, undone: str, folder: str) -> None:
    """A blank folder name (a shell's unset variable) is refused: Path("") is the working
    directory, which nobody named."""
    if isinstance(value, str) and not value.strip():
        raise ConfigError(
            f"{option} {value!r} is an empty path, which would be read as the working directory; "
            f"nothing was {undone}. Give {folder} by name ('.' for the working directory itself)"
        )


def _render_path(out: str | Path, option: str) -> Path:
    """The render folder named by ``option``, absolute; an empty name, a link loop or a line
    break (which would break the one-path-a-line script list) refused."""
    refuse_empty_path(out, option, "rendered", "the folder for the rendered files")
    out = real_path(out, f"render folder ({option})")
    if not str(out).isprintable():
        raise ConfigError(
            f"render folder {str(out)!r} holds a line break or control character; the launch "
            "scripts list it one path a line: choose a plain folder name"
        )
    return out


def _writable_folder(out: Path, option: str) -> Path:
    if (problem := folder_write_problem(out, create=True)) is not None:
        raise ConfigError(
            f"cannot write the rendered files to {str(out)!r}: {problem}; nothing was rendered. "
            f"Choose a writable folder ({option}) or fix its permissions"
        )
    return out


def render(
    scenario: str | Path,
    platform: str | Path,
    out: str | Path | None,
    variants: Sequence[str] | None = None,
    overrides: Iterable[str] = (),
    resume: str | None = None,
    workdir: str | Path | None = None,
    option: str = "--out",
) -> tuple[Resolution, list[Path]]:
    """Resolve, then write each variant's configuration and launch script, ``resolution.json`` and
    ``launch_scripts.txt`` into ``out`` (else experiments/local/train/_rendered/SCENARIO/PLATFORM);
    ``option`` is the flag that named ``out``."""
    # a mistyped folder is named before the resolution's own findings; made only after them
    given = None if out is None else _render_path(out, option)
    res = resolve(scenario, platform, variants, overrides)
    workdir = real_path(workdir or Path.cwd(), "working directory")
    resume = checked_resume(resume, res, workdir)
    default = OUTPUT_ROOT / "train" / "_rendered" / res.scenario.name / res.platform.name
    out = _writable_folder(given or _render_path(default, option), option)
    files: list[tuple[Path, str, Output]] = []
    scripts = []
    slurm = res.platform.launcher == "slurm"
    for v in res.variants:
        v.config_path = inside(out, f"{v.name}.yaml", f"variant {v.name!r}: configuration")
        v.launch = launch_command(res.platform, v.config_path, resume)
        name, kind = (f"{v.name}.sbatch", "batch") if slurm else (f"{v.name}.sh", "launch")
        script = inside(out, name, f"variant {v.name!r}: {kind} script")
        text = slurm_script(res, v, workdir, out) if slurm else local_script(res, v, workdir)
        config_text = f"{_rendered_head(res, v)}\n{v.config.to_yaml()}"
        script_kind = Output(
            "launch script rendered by heptstudy", script.suffix, RENDERED.encode()
        )
        files += [(v.config_path, config_text, CONFIG_FILE), (script, text, script_kind)]
        scripts.append(script)
    resolution = json.dumps({"schema": RESOLUTION_SCHEMA, **res.to_dict()}, indent=2) + "\n"
    files.append((out / "resolution.json", resolution, RESOLUTION_FILE))
    files.append((out / "launch_scripts.txt", "".join(f"{s}\n" for s in scripts), SCRIPT_LIST))
    # every file is rendered, and every one in the way refused, before the first is written
    with holding(out, f"render folder ({option})"):
        write_output_files(files, option)
    return res, scripts
