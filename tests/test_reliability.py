"""Nothing lost, nothing injected (issue 26): one test per mechanism, each ending in a clear
refusal or the correct result, with no committed file changed.

* names that become paths follow one rule, and every output path stays inside its folder;
* committed results are written only by ``--reference`` studies;
* rendered scripts run with stub ``srun``/``scontrol``/``torchrun``/``heptstudy`` execute nothing
  that a name or value holds, and the stubs receive the values verbatim;
* the report page escapes every user-given text;
* a training run folder and a study folder are held by a lock (two processes);
* a full disk (the write seam of :mod:`heptstudy.stand_ins`, and ``ulimit -f``) loses no
  measurement and leaves nothing that blocks a retry or a resume;
* every reader validates what it reads.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from heptstudy.errors import HeptstudyError
from tests.conftest import (
    TINY_MODEL,
    failing_writes,
    heptstudy_under_file_limit,
    run_cli,
    set_options,
    tiny_train_overrides,
)

ROOT = Path(__file__).resolve().parents[1]
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
#: Shell text that would leave a file named PWNED behind if it ever ran.
HOSTILE = ["$(touch PWNED)", "`touch PWNED`", "a;touch PWNED", "${X}", 'it\'s "q"', "x\ny"]


def _git_status() -> str:
    res = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", "experiments", "figures"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return res.stdout


@pytest.fixture
def clean_tree():
    """The committed results and figures are exactly as before the test."""
    before = _git_status()
    yield
    assert _git_status() == before


# ------------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", ".hidden", "../../escape_run", "a/b", "a\\b", "a b", "a\nb", "$(x)", "x" * 101],
)
def test_one_rule_refuses_every_name_that_is_not_an_identifier(name):
    from heptstudy.names import NAME_RULE, check_name

    with pytest.raises(HeptstudyError) as err:
        check_name(name, "run name")
    text = str(err.value)
    assert "run name" in text and repr(name) in text and NAME_RULE in text and "rename it" in text


@pytest.mark.parametrize("name", ["baseline_b4", "checkpointed_every2_b16", "lumi-mi250x", "v1.2"])
def test_identifiers_pass(name):
    from heptstudy.names import check_name

    assert check_name(name, "run name") == name


def test_output_paths_stay_inside_their_folder(tmp_path):
    from heptstudy.names import OutsideFolder, inside

    (tmp_path / "out").mkdir()
    assert inside(tmp_path / "out", "a.json", "report") == tmp_path / "out" / "a.json"
    with pytest.raises(OutsideFolder, match="outside its folder"):
        inside(tmp_path / "out", "../escape.json", "report")
    (tmp_path / "out" / "link").symlink_to(tmp_path)
    with pytest.raises(OutsideFolder, match="symbolic link"):
        inside(tmp_path / "out", "link/escape.json", "report")


@pytest.mark.parametrize("where", ["run", "matrix"])
def test_matrix_names_are_refused_where_they_are_read(where, tmp_path, clean_tree):
    from heptstudy.study.matrix import load_matrix

    bad = "../../../experiments/cpu_reference/baseline_b1"
    run = {"batch_size": 1, "checkpointing": False}
    matrix = {"name": "t", "runs": [run]}
    if where == "run":
        run["name"] = bad
    else:
        matrix["name"] = bad
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(matrix))
    with pytest.raises(HeptstudyError) as err:
        load_matrix(path)
    assert repr(bad) in str(err.value) and "m.yaml" in str(err.value)


def _scenario(tmp_path: Path, name="s", variant="v") -> Path:
    recipe = yaml.safe_load((ROOT / "configs/training/scenarios/cld_pf_default.yaml").read_text())
    first = next(iter(recipe["variants"]))
    recipe["name"] = name
    recipe["variants"] = {variant: recipe["variants"][first]}
    # small enough for any test split: the checks must not depend on whether this checkout
    # holds the study's generated data under data/tfds (64 test events after `make study`)
    recipe["shared"]["data"].update(nvalid=8, ntest=8)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _platform(tmp_path: Path, base="lumi_mi250x", **fields) -> Path:
    data = yaml.safe_load((ROOT / f"configs/training/platforms/{base}.yaml").read_text())
    data.update(fields)
    path = tmp_path / "platform.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "what", ["scenario", "variant", "platform", "partition", "account", "time_limit"]
)
def test_scenario_platform_and_directive_values_are_refused(what, tmp_path):
    from heptstudy.scenario.render import render

    bad = "../../../escaped" if what in ("scenario", "variant", "platform") else "g\ntouch PWNED"
    scenario = _scenario(
        tmp_path,
        name=bad if what == "scenario" else "s",
        variant=bad if what == "variant" else "v",
    )
    fields = {"name": bad} if what == "platform" else {}
    if what in ("partition", "account", "time_limit"):
        fields[what] = bad
    platform = _platform(tmp_path, **fields)
    out = tmp_path / "a" / "b" / "render"
    with pytest.raises(HeptstudyError) as err:
        render(scenario, platform, out)
    assert repr(bad) in str(err.value) or what in str(err.value)
    assert not out.exists() and not list(tmp_path.rglob("escaped*"))


# ----------------------------------------------------------------------- committed results


@pytest.mark.parametrize(
    "argv",
    [
        ["study", "aggregate", "--out", "{tmp}", "--figures", "figures/cpu_reference"],
        ["study", "aggregate", "--out", "experiments/cpu_reference", "--figures", "{tmp}/f"],
        ["data", "stats", "--data-dir", "{data}", "--out", "experiments/data_stats"],
        ["bench", "--output", "experiments/cpu_reference/baseline_b1.json", "--data-dir", "{data}"],
        ["bench", "backbone", "--hits", "64", "--output", "experiments/data_stats/backbone.json"],
    ],
    ids=["aggregate-figures", "aggregate-out", "data-stats", "bench", "bench-backbone"],
)
def test_committed_results_are_refused_by_every_other_command(
    argv, tmp_path, tiny_data_dir, clean_tree, monkeypatch
):
    monkeypatch.chdir(ROOT)
    argv = [a.format(tmp=tmp_path, data=tiny_data_dir) for a in argv]
    code, _, err = run_cli(*argv)
    assert code == 2, err
    assert "committed reference folder" in err and "--reference" in err
    assert "nothing was written" in err


def test_data_stats_default_is_a_scratch_folder():
    from heptstudy.cli.data import DEFAULT_STATS_DIR
    from heptstudy.committed import committed_place
    from heptstudy.paths import OUTPUT_ROOT

    assert DEFAULT_STATS_DIR.startswith(f"{OUTPUT_ROOT}/")
    assert committed_place(ROOT / DEFAULT_STATS_DIR) is None
    ignored = subprocess.run(["git", "check-ignore", "-q", DEFAULT_STATS_DIR], cwd=ROOT)
    assert ignored.returncode == 0


def test_a_study_pending_folder_is_not_committed():
    # a reference study measures into experiments/NAME/.pending/ (ignored by git)
    from heptstudy.committed import committed_place

    assert committed_place(ROOT / "experiments/cpu_reference/.pending/baseline_b1.json") is None
    place = committed_place(ROOT / "experiments/cpu_reference/baseline_b1.json")
    assert place is not None and place.name == "cpu_reference"


# ----------------------------------------------------------------------------- shell text

STUB = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv, "env": os.environ.get("HOSTILE_ENV")}) + "\\n")
if os.path.basename(sys.argv[0]) == "scontrol":
    print("node001")
"""


def _stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("srun", "scontrol", "sbatch", "torchrun", "heptstudy", "module"):
        path = bin_dir / tool
        path.write_text(STUB)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STUB_LOG": str(tmp_path / "stub.log"),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node001",
        "USER": "tester",
        "HOME": str(tmp_path),
        "X": "from the job",
    }


@pytest.mark.parametrize("launcher", ["slurm", "local"])
@pytest.mark.parametrize("value", HOSTILE)
def test_rendered_scripts_run_nothing_that_a_value_holds(launcher, value, tmp_path):
    from heptstudy.scenario.render import render

    work = tmp_path / f"work {value[:12]}"  # the working folder's own name is hostile too
    work.mkdir()
    base = "lumi_mi250x" if launcher == "slurm" else "local_cpu"
    platform = _platform(
        tmp_path,
        base=base,
        env={"HOSTILE_ENV": value, "CACHE": "/tmp/${USER}-cache-${SLURM_JOB_ID}"},
        modules=[value],
    )
    out = tmp_path / f"render {value[:12]}".replace("\n", "_")  # a line break is refused
    resume = f"ckpt/{value}.pt"
    (work / "ckpt").mkdir()
    (work / resume).write_bytes(b"")  # the render checks it exists
    _, scripts = render(_scenario(tmp_path), platform, out, resume=resume, workdir=work)
    env = _stubs(tmp_path)
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
        done = subprocess.run(
            ["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("PWNED")), "shell text from a value was executed"
    calls = [json.loads(line) for line in Path(env["STUB_LOG"]).read_text().splitlines()]
    trainer = [c for c in calls if "--resume" in c["argv"]]
    assert trainer, calls
    for call in trainer:
        argv = call["argv"]
        assert argv[argv.index("--resume") + 1] == resume  # verbatim
        if launcher == "slurm":  # literal, except a plain ${NAME}, which the job expands
            assert call["env"] == ("from the job" if value == "${X}" else value)
            assert "42" in argv and "node001:29500" in argv  # the launcher's own ${VAR}s
    if launcher == "slurm":
        assert any(c["argv"][1:] == ["load", value] for c in calls)
        assert 'CACHE="/tmp/${USER}-cache-${SLURM_JOB_ID}"' in scripts[0].read_text()


def test_newline_in_render_folder_is_refused(tmp_path):
    from heptstudy.scenario.render import render

    out = tmp_path / "a\n#SBATCH --x"
    with pytest.raises(HeptstudyError, match="line break"):
        render(_scenario(tmp_path), _platform(tmp_path), out)
    assert not out.exists()


def test_render_into_an_unwritable_folder_is_one_message(tmp_path, capsys):
    code, _, err = run_cli(
        "scenario",
        "resolve",
        "--scenario",
        str(_scenario(tmp_path)),
        "--platform",
        "local_cpu",
        "--dry-run",
        "--render-dir",
        "/proc/nope/render",
    )
    assert code == 2 and "/proc/nope/render" in err and "nothing was rendered" in err


def test_resolve_with_a_missing_data_dir_fails(tmp_path):
    code, out, err = run_cli(
        "scenario",
        "resolve",
        "--scenario",
        "cld_pf_default",
        "--platform",
        "local_cpu",
        "--data-dir",
        str(tmp_path / "nonexistent"),
    )
    assert code == 2 and "[rule data-dir-exists]" in err and "nonexistent" in err
    assert "invariants" not in out


# ---------------------------------------------------------------------------------- HTML

MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def test_report_page_escapes_every_text_field(tiny_data_dir):
    import pandas as pd

    from heptstudy import study

    df = pd.DataFrame(
        [
            {
                "name": f"run{MARKUP}",
                "kind": "memory",
                "status": "ok",
                "device": f"cpu{MARKUP}",
                "device_kind": "cpu",
                "dtype": f"float32{MARKUP}",
                "threads": 2,
                "torch": f"2.13{MARKUP}",
                "dataset": f"ds{MARKUP}",
                "data_dir": f"/d{MARKUP}",
                "synthetic": True,
                "counted_steps": 1,
                "warmup_steps": 1,
                "host": f"host{MARKUP}",
                "allocator": f"glibc{MARKUP}",
                "allocator_line": "platform",
                "round": 1,
                "load_average_1min": 9.0,
                "platform": f"plat{MARKUP}",
            }
        ]
    )
    page = study.heading(f"title{MARKUP}") + study.study_statement(
        df, f"description{MARKUP}", [f"note{MARKUP}"]
    )
    page += study.show(df).to_html()
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;" in page
    for field in ("title", "description", "note", "run", "cpu", "ds", "host", "glibc", "plat"):
        assert f"{field}&lt;script&gt;" in page, field


# --------------------------------------------------------------------------------- locks

HOLDER = """
import sys, time
from heptstudy.locks import holding
with holding(sys.argv[1], "folder"):
    print("held", flush=True)
    if sys.argv[2] == "die":
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
"""


def _hold(folder: Path, how: str = "sleep") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), how],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if how == "sleep":
        assert proc.stdout.readline().strip() == "held"
    else:
        proc.wait(timeout=60)
    return proc


def test_a_held_folder_is_refused_naming_the_holder(tmp_path):
    from heptstudy.locks import FolderInUse, holding

    proc = _hold(tmp_path / "run")
    try:
        with pytest.raises(FolderInUse) as err, holding(tmp_path / "run", "train.out_dir"):
            pass
        text = str(err.value)
        assert (
            f"pid {proc.pid}" in text and "started 20" in text and "in use by another run" in text
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, capsys):
    from heptstudy.locks import LOCK_NAME, holding

    proc = _hold(tmp_path / "run", "die")
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "run" / LOCK_NAME).exists()
    with holding(tmp_path / "run", "train.out_dir"):
        pass
    said = capsys.readouterr().err
    assert f"taking over the lock left by pid {proc.pid}" in said and "no longer running" in said
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_second_training_into_a_held_out_dir_is_refused(tmp_path, tiny_data_dir):
    out = tmp_path / "run"
    proc = _hold(out)
    try:
        code, _, err = run_cli(
            "train", "--no-progress", *set_options(tiny_train_overrides(tiny_data_dir, out))
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert code == 2 and f"pid {proc.pid}" in err
    assert [p.name for p in out.iterdir()] == [".heptstudy.lock"]  # the holder's; nothing else


def test_second_study_into_a_held_out_is_refused(tmp_path, tiny_data_dir):
    from heptstudy import study

    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "defaults": {"data_dir": str(tiny_data_dir), "steps": 1, "warmup": 1},
                "runs": [{"batch_size": 1, "passes": "timing", "overrides": list(TINY_MODEL)}],
            }
        )
    )
    out = tmp_path / "study"
    proc = _hold(out)
    try:
        with pytest.raises(HeptstudyError, match=f"pid {proc.pid}"):
            study.run_study(matrix, out, progress=False, aggregate=False)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    # the holder's lock only: no report, no matrix copy
    assert [p.name for p in out.rglob("*") if p.is_file()] == [".heptstudy.lock"]


# ---------------------------------------------------------------------------- full disks


def _bench_argv(data_dir, output) -> list[str]:
    argv = ["bench", "--batch-size", "1", "--passes", "timing", "--steps", "1", "--warmup", "0"]
    return argv + ["--data-dir", str(data_dir), "--output", str(output), "--no-progress"]


@pytest.mark.parametrize("where", ["kept-file", "stdout"])
def test_bench_on_a_full_disk_keeps_the_measurement(where, tmp_path, tiny_data_dir):
    out = tmp_path / "b1.json"
    applies = (lambda p: p == str(out)) if where == "kept-file" else (lambda p: True)
    with failing_writes(ENOSPC, applies):
        code, said, err = run_cli(*_bench_argv(tiny_data_dir, out), *set_options(TINY_MODEL))
    assert code == 2
    assert "baseline_b1" in said.splitlines()[0]  # the summary, printed before the write
    assert str(out) in err and "No space left on device" in err
    assert not out.exists() and not list(tmp_path.glob(".b1.json*"))  # no partial file
    if where == "kept-file":
        kept = Path(err.split("it is kept in ")[1].split(". ")[0])
        report = json.loads(kept.read_text())
        kept.unlink()
    else:
        assert "printed above in full" in err
        body = said.split("-----\n", 1)[1].rsplit("----- end of", 1)[0]
        report = json.loads(body)
    assert report["name"] == "baseline_b1" and report["summary"]["mean_step_time_s"] > 0


def test_file_size_limit_in_a_subprocess_keeps_the_result(tmp_path):
    out = tmp_path / "backbone.json"
    argv = ["bench", "backbone", "--hits", "64", "--repeats", "1", "--output", str(out)]
    # torch looks for a temporary folder for its compile cache, which the limit denies
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = heptstudy_under_file_limit(0, *argv, *set_options(TINY_MODEL), cwd=tmp_path, env=cache)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and str(out) in done.stderr
    assert "File too large" in done.stderr
    assert not out.exists()
    assert '"hits": 64' in done.stdout  # printed in full, the temporary folder is limited too


def test_any_other_refused_write_is_one_message(tmp_path, tiny_data_dir):
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(tmp_path / "stats"))
    with failing_writes(quota):
        code, _, err = run_cli(
            "data", "stats", "--data-dir", str(tiny_data_dir), "--out", str(tmp_path / "stats")
        )
    assert code == 1 and "Disk quota exceeded" in err and str(tmp_path / "stats") in err
    assert not [p for p in (tmp_path / "stats").rglob("*") if p.is_file()]  # no partial file


def test_train_write_failure_leaves_nothing_that_blocks_the_resume(tmp_path, tiny_data_dir):
    from heptstudy.atomic import WriteFailed
    from heptstudy.config import load_config
    from heptstudy.train.trainer import train

    out = tmp_path / "run"
    cfg = load_config(overrides=tiny_train_overrides(tiny_data_dir, out))
    with (
        failing_writes(ENOSPC, lambda p: p.endswith("step_000004.pt")),
        pytest.raises(WriteFailed) as err,
    ):
        train(cfg, progress=False)
    assert "step 4" in str(err.value) and "--resume" in str(err.value)
    assert "step_000004.pt could not be written" in str(err.value)
    assert "step_000002.pt" in str(err.value)
    assert not (out / "predictions" / "step_000004.npz").exists()
    summary = train(cfg, resume=out / "checkpoints" / "step_000002.pt", progress=False)
    assert summary["step"] == 4 and (out / "checkpoints" / "step_000004.pt").exists()


def test_data_generate_finalises_both_data_sets_or_neither(tmp_path):
    data = tmp_path / "tfds"
    argv = ["data", "generate", "--data-dir", str(data), "--events-train", "4"]
    argv += ["--events-test", "2", "--seed", "1", "--occupancy-scale", "0.03", "--no-progress"]
    with failing_writes(ENOSPC, lambda p: "cld_edm_ttbar_pf" in p):
        code, _, err = run_cli(*argv, "--workers", "1")
    assert code == 2 and "none of them was put in place" in err
    assert not [p for p in data.rglob("*") if p.is_file()]  # nothing half-written
    code, _, err = run_cli(*argv, "--workers", "1")  # the retry succeeds
    assert code == 0, err
    for name in ("cld_edm_ttbar_hits", "cld_edm_ttbar_pf"):
        assert (data / name / "1" / "3.2.1" / "dataset_info.json").is_file()


# ------------------------------------------------------------------------------- readers


@pytest.fixture(scope="module")
def good_report(tiny_data_dir, tmp_path_factory) -> str:
    """A bench report of the tiny model, measured once for the reader tests."""
    path = tmp_path_factory.mktemp("good") / "good.json"
    code, _, err = run_cli(*_bench_argv(tiny_data_dir, path), *set_options(TINY_MODEL))
    assert code == 0, err
    return path.read_text()


@pytest.mark.parametrize(
    "edit,fragments",
    [
        (lambda r: r["summary"].update(max_peak_allocated_mib=-5.0), ["max_peak_allocated_mib"]),
        (lambda r: r["steps"][0].update(time_s=-1.0), ["steps.0.time_s"]),
        (lambda r: r.update(schema_version="heptstudy.bench/2"), ["heptstudy.bench/2"]),
        (lambda r: r.update(batch_size="four"), ["batch_size"]),
        (lambda r: r["steps"][0].update(padded_hits="many"), ["steps.0.padded_hits"]),
    ],
    ids=["negative-peak", "negative-time", "other-version", "wrong-type", "wrong-type-step"],
)
def test_every_reader_names_the_file_and_field_it_refuses(edit, fragments, good_report, tmp_path):
    from heptstudy.fitting.reports import read_groups
    from heptstudy.measure.report import ReportError, read_report
    from heptstudy.study.frames import load_reports

    report = json.loads(good_report)
    edit(report)
    bad = tmp_path / "reports" / "bad_b1.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps(report))
    with pytest.raises(ReportError) as err:
        read_report(bad)
    for text in ("bad_b1.json", *fragments):
        assert text in str(err.value)
    _, rejected = read_groups([bad.parent])  # fit --reports: refused with the reason, no crash
    assert [r.path for r in rejected] == [str(bad)]
    assert all(f in rejected[0].reason for f in fragments)
    with pytest.warns(UserWarning, match="bad_b1.json"):  # aggregate: skipped and named
        assert load_reports(bad.parent) == []


# ---------------------------------------------------------------------- still-open items


def test_resume_at_the_end_says_there_is_nothing_to_train(tmp_path, tiny_data_dir):
    out = tmp_path / "run"
    overrides = tiny_train_overrides(tiny_data_dir, out, num_steps=2, val_freq=2)
    assert run_cli("train", "--no-progress", *set_options(overrides))[0] == 0
    before = sorted(p.name for p in out.rglob("*"))
    ckpt = out / "checkpoints" / "step_000002.pt"
    code, said, err = run_cli(
        "train", "--no-progress", *set_options(overrides), "--resume", str(ckpt)
    )
    assert code == 2 and "nothing to train" in err and "train.num_steps" in err
    assert "trained to step" not in said
    assert sorted(p.name for p in out.rglob("*")) == before


def test_unwritable_out_dir_is_refused_before_training(tmp_path, tiny_data_dir):
    code, said, err = run_cli(
        "train", "--no-progress", *set_options(tiny_train_overrides(tiny_data_dir, "/proc/nope"))
    )
    assert code == 2 and "/proc/nope" in err and "nothing was written" in err
    assert said == ""


@pytest.mark.parametrize("command", ["train", "bench"])
def test_model_too_large_for_the_host_is_refused_before_building(command, tmp_path, tiny_data_dir):
    huge = ["model.heptv2.embedding_dim=1000000", "model.heptv2.width=1000000"]
    if command == "train":
        argv = [
            "train",
            "--no-progress",
            *set_options(tiny_train_overrides(tiny_data_dir, tmp_path / "run")),
        ]
    else:
        argv = [*_bench_argv(tiny_data_dir, tmp_path / "run" / "b1.json"), *set_options(TINY_MODEL)]
    t0 = time.perf_counter()
    code, _, err = run_cli(*argv, *set_options(huge))
    assert code == 2, err
    assert "parameters" in err and "GiB available" in err and "embedding_dim (now 1000000" in err
    assert time.perf_counter() - t0 < 60 and not list(tmp_path.rglob("*.json"))


def test_free_space_is_checked_where_the_size_is_known(tmp_path):
    from heptstudy.atomic import free_space_problem

    assert free_space_problem(tmp_path / "new" / "run", 1) is None
    problem = free_space_problem(tmp_path / "new" / "run", 2**62)
    assert str(tmp_path) in problem and "MiB free" in problem and "needed" in problem


def test_train_out_dir_and_output_follow_the_working_directory(tmp_path, monkeypatch):
    from heptstudy.config import load_config
    from heptstudy.measure.request import MeasurementRequest

    monkeypatch.chdir(tmp_path)
    cfg = load_config(overrides=["train.out_dir=runs/a"])
    request = MeasurementRequest.build(kind="memory", batch_size=1, output="runs/a.json")
    assert Path(cfg.train.out_dir).parent == request.resolve().report_path.resolve().parent


def test_a_smaller_aggregate_moves_the_old_tables_and_figures_aside(tmp_path, monkeypatch):
    import papermill

    from heptstudy.study import runner

    out, figures = tmp_path / "study", tmp_path / "study" / "figures"
    figures.mkdir(parents=True)
    (out / "front.csv").write_text("batch_size,policy\n4,full\n")  # one the study wrote
    for old in (figures / "policy_front.png", figures / "kept.png"):
        old.write_text("old")

    def fake_aggregate(input_path, output_path, **_):
        (figures / "kept.png").write_text("new")  # written again by this aggregate
        Path(output_path).write_text("{}")

    monkeypatch.setattr(papermill, "execute_notebook", fake_aggregate)
    monkeypatch.setattr(runner, "render_html", lambda nb, html: Path(html))
    runner.aggregate_study(out, figures)
    assert (figures / "kept.png").read_text() == "new"
    assert not (out / "front.csv").exists() and not (figures / "policy_front.png").exists()
    moved = sorted(p.name for p in (out / "superseded").rglob("*") if p.is_file())
    assert moved == ["front.csv", "policy_front.png"]


# ---------------------------------------------------------------------- notebook users


def test_progress_bars_have_their_widgets():
    import ipywidgets  # noqa: F401 - tqdm.auto's notebook bars need it

    assert '"ipywidgets>=' in (ROOT / "pyproject.toml").read_text()


KERNEL_CHECK = textwrap.dedent(
    """
    import sys
    import nbformat, papermill
    from heptstudy.study.runner import execute_notebook
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, "in.ipynb")
    run = execute_notebook if sys.argv[1] == "study" else papermill.execute_notebook
    run("in.ipynb", "out.ipynb", kernel_name="python3", progress_bar=False)
    """
)


@pytest.mark.parametrize("how", ["plain", "study"])
def test_study_kernels_print_no_unencrypted_tcp_warning(how, tmp_path):
    """Papermill's own kernel (TCP) warns; the study's (IPC, heptstudy.study.runner) does not,
    and leaves no socket file behind."""
    done = subprocess.run(
        [sys.executable, "-c", KERNEL_CHECK, how],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    said = done.stderr + (tmp_path / "out.ipynb").read_text()
    assert ("without encryption" in said) == (how == "plain")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.ipynb", "out.ipynb"]


def test_bench_s_own_output_before_backbone_is_where_the_result_goes(tmp_path):
    """`bench --output F backbone ...`: argparse reads --output as bench's own option; the
    backbone bench writes F, not nothing."""
    out = tmp_path / "backbone.json"
    argv = ["bench", "--output", str(out), "backbone", "--hits", "64", "--repeats", "1"]
    code, text, err = run_cli(*argv, *set_options(TINY_MODEL))
    assert code == 0, err
    assert json.loads(out.read_text())["hits"] == 64 and f"written: {out}" in text
