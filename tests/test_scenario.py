"""Training scenarios: resolution on the platform profiles, the invariant rules, rendered launch
scripts and the local smoke wrapper. Expected numbers are computed from the YAML files."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from heptstudy import scenario as sc
from heptstudy.cli import main
from heptstudy.config import HIT_VARIANT, TRACK_CLUSTER_VARIANT
from heptstudy.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "configs" / "training" / "scenarios"
PLATFORMS = ROOT / "configs" / "training" / "platforms"
RECIPE = SCENARIOS / "cld_pf_heptv2_batch512_50k.yaml"


@pytest.fixture(autouse=True)
def _no_local_data(tmp_path, monkeypatch):
    """Resolve away from the checkout: a study data set in its data/tfds (small test split) must
    not change what these tests see; the recipe's own test_split_events applies. The recipes'
    relative data_dir is the repository's, wherever the command runs."""
    import heptstudy.paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(heptstudy.paths, "REPO_ROOT", tmp_path)


CLUSTER_PLATFORMS = ["h100", "lumi_mi250x"]


def _away_from_local_data(tmp_path: Path) -> list[str]:
    """A command's own process does not see the fixture's patch: its data directory is given, a
    folder without the data set (so the recipe's own test_split_events applies)."""
    (tmp_path / "no_data").mkdir(exist_ok=True)
    return ["--set", f"data.data_dir={tmp_path / 'no_data'}"]


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _expected(scenario: Path, platform: Path) -> dict:
    """The numbers a resolution must give, derived from the files alone."""
    shared = _yaml(scenario)["shared"]
    plat = _yaml(platform)
    t = shared["train"]
    world = plat["devices_per_node"] * plat.get("nodes", 1)
    accum = t.get("grad_accumulation", 1)
    return {
        "world": world,
        "per_device": t["global_batch_size"] // (world * accum),
        "accum": accum,
        "presentations": t["global_batch_size"] * t["num_steps"],
        "val_steps": list(range(t["val_freq"], t["num_steps"] + 1, t["val_freq"])),
        "ckpt_steps": list(range(t["checkpoint_freq"], t["num_steps"] + 1, t["checkpoint_freq"])),
        "dtype": plat["dtype"],
        "backend": plat["attention_backend"],
    }


@pytest.mark.parametrize("platform", CLUSTER_PLATFORMS)
@pytest.mark.parametrize("variant", [TRACK_CLUSTER_VARIANT, HIT_VARIANT])
def test_recipe_resolves_on_cluster_platforms(platform, variant):
    plat_path = PLATFORMS / f"{platform}.yaml"
    exp = _expected(RECIPE, plat_path)
    v = sc.resolve(RECIPE, plat_path, [variant]).variant(variant)
    assert v.world_size == exp["world"]
    t = v.config.train
    assert t.global_batch_size == v.per_device_batch * v.world_size * v.grad_accumulation
    assert v.per_device_batch == exp["per_device"]
    assert v.grad_accumulation == exp["accum"]
    assert v.event_presentations == exp["presentations"]
    assert v.val_steps == exp["val_steps"]
    assert v.checkpoint_steps == exp["ckpt_steps"]
    assert (v.dtype, v.attention_backend) == (exp["dtype"], exp["backend"])
    assert v.config.train.dtype == exp["dtype"]
    assert v.config.model.heptv2.attention_backend == exp["backend"]
    assert v.config.model.variant == variant
    assert v.config.model.heptv2.activation_checkpointing == (
        "full" if variant == HIT_VARIANT else "off"
    )


def test_recipe_files_hold_the_documented_recipe():
    # The numbers, as a guard against an accidental edit of the recipe files.
    for platform in CLUSTER_PLATFORMS:
        exp = _expected(RECIPE, PLATFORMS / f"{platform}.yaml")
        assert (exp["per_device"], exp["accum"], exp["presentations"]) == (48, 1, 19_200_000)
        assert exp["val_steps"][0] == exp["ckpt_steps"][0] == 5000
        assert exp["val_steps"][-1] == exp["ckpt_steps"][-1] == 50000


@pytest.mark.parametrize("platform", CLUSTER_PLATFORMS)
def test_cli_resolve_prints_the_numbers(platform, capsys):
    exp = _expected(RECIPE, PLATFORMS / f"{platform}.yaml")
    assert main(["scenario", "resolve", "--scenario", str(RECIPE), "--platform", platform]) == 0
    out = capsys.readouterr().out
    for variant in (TRACK_CLUSTER_VARIANT, HIT_VARIANT):
        assert f"variant {variant}" in out
    assert out.count(f"{exp['per_device']} events per device") == 2
    assert out.count(f"event presentations  {exp['presentations']:,}") == 2
    assert f"{exp['val_steps'][0]:,}, " in out and f"{exp['val_steps'][-1]:,} (every" in out
    assert "invariants passed" in out

    assert (
        main(["scenario", "resolve", "--scenario", str(RECIPE), "--platform", platform, "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    for v in data["variants"].values():
        assert v["per_device_batch"] == exp["per_device"]
        assert v["grad_accumulation"] == exp["accum"]
        assert v["event_presentations"] == exp["presentations"]
        assert v["val_steps"] == exp["val_steps"] and v["checkpoint_steps"] == exp["ckpt_steps"]
        assert v["config"]["train"]["dtype"] == exp["dtype"]


def test_dry_run_prints_launch_commands(tmp_path, capsys, monkeypatch):
    rc = main(
        [
            "scenario",
            "resolve",
            "--scenario",
            "cld_pf_heptv2_batch512_50k",
            "--platform",
            "h100",
            "--dry-run",
            "--render-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "nothing was launched" in out
    for variant in (TRACK_CLUSTER_VARIANT, HIT_VARIANT):
        cfg = tmp_path / f"{variant}.yaml"
        line = next(x for x in out.splitlines() if x.endswith(f"train --config {cfg}"))
        assert line.startswith("srun ") and "torchrun --nnodes 1 --nproc-per-node 8 " in line
        assert "-m heptstudy.cli train" in line
        assert _yaml(cfg)["train"]["global_batch_size"] == 384  # the resolved, full config
    monkeypatch.chdir(tmp_path)  # the checkpoint is found as the job finds it: from here
    (tmp_path / "ck.pt").write_bytes(b"a training state")
    rc = main(
        [
            "scenario",
            "resolve",
            "--scenario",
            "cld_pf_heptv2_batch512_50k",
            "--platform",
            "local_cpu",
            "--dry-run",
            "--render-dir",
            str(tmp_path / "local"),
            "--variant",
            HIT_VARIANT,
            "--set",
            "train.global_batch_size=8",
            "--resume",
            "ck.pt",
        ]
    )
    out = capsys.readouterr().out
    cfg = tmp_path / "local" / f"{HIT_VARIANT}.yaml"
    assert f"heptstudy train --config {cfg} --resume ck.pt" in out


def test_default_scenario_unchanged():
    res = sc.resolve("cld_pf_default", "h100")
    assert {v.name for v in res.variants} == {TRACK_CLUSTER_VARIANT, HIT_VARIANT}
    shared = _yaml(SCENARIOS / "cld_pf_default.yaml")["shared"]["train"]
    for v in res.variants:
        assert v.config.train.global_batch_size == shared["global_batch_size"] == 64
        assert v.per_device_batch == 64 // 8


def test_out_dir_is_a_root_per_variant(tmp_path):
    res = sc.resolve(
        RECIPE, "local_cpu", overrides=[f"train.out_dir={tmp_path}", "train.global_batch_size=8"]
    )
    dirs = {v.config.train.out_dir for v in res.variants}
    assert dirs == {
        str(tmp_path / "cld_pf_heptv2_batch512_50k" / v)
        for v in (TRACK_CLUSTER_VARIANT, HIT_VARIANT)
    }


def test_variant_overrides_reach_the_named_variant_only():
    auto = {HIT_VARIANT: ["model.heptv2.activation_checkpointing=auto"]}
    over = ["train.global_batch_size=8"]
    res = sc.resolve(RECIPE, "local_cpu", overrides=over, variant_overrides=auto)
    settings = {v.name: v.config.model.heptv2.activation_checkpointing for v in res.variants}
    assert settings[HIT_VARIANT] == "auto" and settings[TRACK_CLUSTER_VARIANT] == "off"
    # given to every variant, the model without a HEPTv2 backbone refuses it
    with pytest.raises(ConfigError, match="track_cluster_mlpf"):
        sc.resolve(RECIPE, "local_cpu", overrides=over + auto[HIT_VARIANT])
    with pytest.raises(sc.ScenarioError, match="nope"):
        sc.resolve(RECIPE, "local_cpu", overrides=over, variant_overrides={"nope": []})


def test_a_value_every_variant_refuses_is_refused_in_the_name_of_the_one_asked_for():
    for asked in (HIT_VARIANT, TRACK_CLUSTER_VARIANT):
        with pytest.raises(ConfigError, match=f"(?s)variant '{asked}':.*dropout"):
            sc.resolve(RECIPE, "local_cpu", [asked], overrides=["model.heptv2.dropout=-1"])


# ----------------------------------------------------------------------------- invariants


def _broken(tmp_path: Path, edit) -> Path:
    data = _yaml(RECIPE)
    edit(data)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _refused(rule: str, *args, **kwargs) -> str:
    with pytest.raises(sc.ScenarioError) as err:
        sc.resolve(*args, **kwargs)
    assert err.value.rule == rule
    msg = str(err.value)
    assert msg.startswith(f"[rule {rule}]")
    return msg


def test_rule_batch_divides_devices(tmp_path):
    path = _broken(tmp_path, lambda d: d["shared"]["train"].update(global_batch_size=100))
    msg = _refused("batch-divides-devices", path, "h100")
    assert "global_batch_size=100" in msg and "world size 8" in msg
    path = _broken(tmp_path, lambda d: d["shared"]["train"].update(grad_accumulation=5))
    assert "grad_accumulation=5" in _refused("batch-divides-devices", path, "lumi_mi250x")


def test_rule_shared_budget(tmp_path):
    def edit(d):
        d["variants"][HIT_VARIANT].setdefault("train", {})["lr"] = 0.002

    msg = _refused("shared-budget", _broken(tmp_path, edit), "h100")
    assert "train.lr" in msg and "0.002" in msg and HIT_VARIANT in msg


def test_rule_frequencies_divide_steps(tmp_path):
    path = _broken(tmp_path, lambda d: d["shared"]["train"].update(val_freq=3000))
    assert "train.val_freq=3000" in _refused("frequencies-divide-steps", path, "h100")
    path = _broken(tmp_path, lambda d: d["shared"]["train"].update(checkpoint_freq=7000))
    assert "checkpoint_freq=7000" in _refused("frequencies-divide-steps", path, "lumi_mi250x")


def test_rule_eval_within_test_split_declared(tmp_path):
    path = _broken(tmp_path, lambda d: d["shared"]["data"].update(nvalid=6000, ntest=6000))
    msg = _refused("eval-within-test-split", path, "h100")
    assert "12000" in msg and "declared" in msg
    path = _broken(tmp_path, lambda d: d.pop("test_split_events"))
    msg = _refused("eval-within-test-split", path, "h100", overrides=[f"data.data_dir={tmp_path}"])
    assert "unknown" in msg and "--data-dir" in msg


def test_rule_eval_within_test_split_from_metadata(tiny_data_dir):
    # the tiny data set's 16 test events, counted in its files (the metadata lists them)
    over = [f"data.data_dir={tiny_data_dir}", "train.global_batch_size=8"]
    res = sc.resolve(RECIPE, "local_cpu", overrides=over + ["data.nvalid=8", "data.ntest=8"])
    assert {v.test_split.events for v in res.variants} == {16}
    msg = _refused(
        "eval-within-test-split",
        RECIPE,
        "local_cpu",
        overrides=over + ["data.nvalid=9", "data.ntest=8"],
    )
    assert "17 exceeds the 16 events" in msg and "dataset_info.json" in msg


def test_rule_platform_exists(tmp_path):
    msg = _refused("platform-exists", RECIPE, tmp_path / "nope.yaml")
    assert "nope.yaml" in msg and "h100" in msg  # lists the known platforms
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**_yaml(PLATFORMS / "h100.yaml"), "devices_per_node": 0}))
    assert "devices_per_node" in _refused("platform-exists", RECIPE, bad)


def test_rule_platform_keeps_recipe(tmp_path):
    path = _broken(tmp_path, lambda d: d["shared"]["train"].update(dtype="float32"))
    msg = _refused("platform-keeps-recipe", path, "h100")
    assert "train.dtype='float32'" in msg and "bfloat16" in msg
    msg = _refused(
        "platform-keeps-recipe",
        RECIPE,
        "lumi_mi250x",
        overrides=["model.heptv2.attention_backend=fused"],
    )
    assert "attention_backend" in msg and "plain" in msg


def test_platform_data_workers_are_a_default(tmp_path):
    for platform in CLUSTER_PLATFORMS:
        v = sc.resolve(RECIPE, PLATFORMS / f"{platform}.yaml").variants[0]
        assert v.config.data.num_workers == _yaml(PLATFORMS / f"{platform}.yaml")["data_workers"]
    given = sc.resolve(RECIPE, "h100", overrides=["data.num_workers=1"]).variants[0]
    assert given.config.data.num_workers == 1
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text(yaml.safe_dump({**_yaml(PLATFORMS / "h100.yaml"), "data_workers": 8}))
    msg = _refused("platform-exists", RECIPE, greedy)
    assert "data_workers=8" in msg and "8 per rank" in msg and "at most 7" in msg


def test_rule_variant_and_scenario_exist(tmp_path):
    assert "track_cluster_mlpf" in _refused("variant-exists", RECIPE, "h100", ["nope"])
    _refused("scenario-exists", tmp_path / "missing.yaml", "h100")
    _refused("scenario-exists", _broken(tmp_path, lambda d: d.update(model={})), "h100")


def test_cli_reports_rule_and_exit_code(tmp_path, capsys):
    path = _broken(tmp_path, lambda d: d["shared"]["train"].update(val_freq=3000))
    assert main(["scenario", "resolve", "--scenario", str(path), "--platform", "h100"]) == 2
    assert "[rule frequencies-divide-steps]" in capsys.readouterr().err


# ----------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("platform", CLUSTER_PLATFORMS)
def test_rendered_slurm_scripts(platform, tmp_path):
    exp = _expected(RECIPE, PLATFORMS / f"{platform}.yaml")
    res, scripts = sc.render(RECIPE, platform, tmp_path)
    assert len(scripts) == 2
    for v, script in zip(res.variants, scripts, strict=True):
        text = script.read_text()
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert f"per-device batch {exp['per_device']}" in text
        assert f"#SBATCH --gpus-per-node={exp['world']}" in text
        assert "srun " in text and f"torchrun --nnodes 1 --nproc-per-node {exp['world']}" in text
        assert f"--config {tmp_path / (v.name + '.yaml')}" in text
        assert _yaml(tmp_path / f"{v.name}.yaml")["train"]["dtype"] == exp["dtype"]
    assert (tmp_path / "launch_scripts.txt").read_text().split() == [str(s) for s in scripts]
    if platform == "lumi_mi250x":
        assert "MIOPEN_USER_DB_PATH" in text and "#SBATCH --partition=standard-g" in text


def _path_without_sbatch(tmp_path: Path, fake_sbatch: bool) -> dict:
    env = dict(os.environ)
    dirs = [
        d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "sbatch").exists()
    ]
    if fake_sbatch:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "sbatch").write_text(
            f'#!/bin/sh\necho "$@" >> {tmp_path}/submitted\necho "Submitted batch job 1"\n'
        )
        (bin_dir / "sbatch").chmod(0o755)
        dirs.insert(0, str(bin_dir))
    env["PATH"] = os.pathsep.join(dirs)
    return env


@pytest.mark.parametrize("script,profile", [("lumi", "mi250x"), ("h100", "h100")])
def test_cluster_wrapper_without_sbatch(script, profile, tmp_path):
    out = tmp_path / "render"
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / script / "train_scenario.sh"),
            "cld_pf_heptv2_batch512_50k",
            profile,
            "--out",
            str(out),
            *_away_from_local_data(tmp_path),
        ],
        env=_path_without_sbatch(tmp_path, False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nothing was submitted" in proc.stdout
    for variant in (TRACK_CLUSTER_VARIANT, HIT_VARIANT):
        script_file = out / f"{variant}.sbatch"
        assert script_file.is_file() and str(script_file) in proc.stdout
        assert "#SBATCH --nodes=1" in proc.stdout  # the scripts are printed too


def test_cluster_wrapper_submits_with_sbatch(tmp_path):
    out = tmp_path / "render"
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "lumi" / "train_scenario.sh"),
            "cld_pf_heptv2_batch512_50k",
            "mi250x",
            "--out",
            str(out),
            *_away_from_local_data(tmp_path),
        ],
        env=_path_without_sbatch(tmp_path, True),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    submitted = (tmp_path / "submitted").read_text().split()
    assert submitted == [str(out / f"{v}.sbatch") for v in (TRACK_CLUSTER_VARIANT, HIT_VARIANT)]
    assert "nothing was submitted" not in proc.stdout


def test_local_wrapper_first_line_and_refusal(tmp_path):
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "local" / "train_scenario.sh"),
            "cld_pf_heptv2_batch512_50k",
            "--variant",
            "nope",
        ],
        env={**os.environ, "RENDER_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.splitlines()[0].startswith(
        "NOTE: local smoke run with NOT production settings"
    )
    assert proc.returncode != 0 and "[rule variant-exists]" in proc.stderr


# ----------------------------------------------------------------------------- smoke run

SMOKE_ENV = {
    "GLOBAL_BATCH_SIZE": "8",
    "NUM_STEPS": "4",
    "VAL_FREQ": "2",
    "CHECKPOINT_FREQ": "2",
    "NVALID": "8",
    "NTEST": "8",
    "NUM_WORKERS": "0",
    "VALIDATION_DIAGNOSTICS_BATCHES": "0",
}


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _checkpoints(out_dir: Path) -> dict[int, Path]:
    """Checkpoint files under out_dir by step, recognised by their content (the trainer's
    checkpoint format), not by a file-name convention."""
    import torch

    from heptstudy.train.state import FORMAT

    found = {}
    for path in sorted(out_dir.rglob("*")):
        if not path.is_file() or path.suffix in {".json", ".jsonl", ".yaml", ".txt", ".log"}:
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            continue
        if isinstance(state, dict) and state.get("format") == FORMAT:
            assert "model" in state and "optimizer" in state
            found[int(state["step"])] = path
    return found


def _records(out_dir: Path) -> list[dict]:
    records = []
    for path in out_dir.rglob("*.jsonl"):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def _run_wrapper(variant: str, env: dict, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "local" / "train_scenario.sh"),
            "cld_pf_heptv2_batch512_50k",
            "--variant",
            variant,
            *extra,
        ],
        env={**os.environ, **SMOKE_ENV, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "NOT production settings" in proc.stdout.splitlines()[0]
    return proc


@pytest.mark.slow
@pytest.mark.skipif(
    not all(
        _have(m)
        for m in ("heptstudy.train.trainer", "heptstudy.data.generate", "heptstudy.cli.data")
    ),
    reason="the trainer, the data generator or the data CLI is not there yet",
)
@pytest.mark.parametrize("variant", [HIT_VARIANT, TRACK_CLUSTER_VARIANT])
def test_local_wrapper_smoke_and_resume(variant, tmp_path):
    from heptstudy.data.generate import generate_datasets

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import TINY_MODEL

    data_dir = tmp_path / "data"
    generate_datasets(
        data_dir, events_train=16, events_test=16, seed=0, configs=("1",), occupancy_scale=0.03
    )
    sets = [a for o in TINY_MODEL for a in ("--set", o)]
    env = {"DATA_DIR": str(data_dir), "RENDER_DIR": str(tmp_path / "render")}

    full = tmp_path / "full"
    _run_wrapper(variant, {**env, "OUT_DIR": str(full)}, *sets)
    run_dir = full / "cld_pf_heptv2_batch512_50k" / variant
    ckpts = _checkpoints(run_dir)
    assert {2, 4} <= set(ckpts), f"checkpoints by step: {ckpts}"
    records = _records(run_dir)
    assert {r["step"] for r in records if r.get("kind") == "validation"} >= {2, 4}
    preds = [p for p in run_dir.rglob("*") if p.is_file() and "pred" in str(p.relative_to(run_dir))]
    assert len(preds) >= 2, f"predictions: {preds}"

    if variant != HIT_VARIANT:
        return  # resuming goes through the same wrapper and trainer for either variant
    resumed = tmp_path / "resumed"
    _run_wrapper(variant, {**env, "OUT_DIR": str(resumed), "RESUME": str(ckpts[2])}, *sets)
    resumed_dir = resumed / "cld_pf_heptv2_batch512_50k" / variant
    assert 4 in _checkpoints(resumed_dir)
    train_steps = [r["step"] for r in _records(resumed_dir) if r.get("kind") == "train"]
    assert train_steps == [3, 4]


def test_shell_scripts_parse():
    for script in ("local", "lumi", "h100"):
        subprocess.run(
            ["bash", "-n", str(ROOT / "scripts" / script / "train_scenario.sh")], check=True
        )
    assert shutil.which("bash")
