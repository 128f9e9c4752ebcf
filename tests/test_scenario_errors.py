"""Bad paths and options given to ``scenario resolve|render`` and the configuration: an empty
folder, an option that does not apply, a resume file that is no checkpoint, each refused with one
message naming it (nothing written); and where a relative data folder points: written in the
project's files (or the default), from the repository; typed on the command line, from the
working directory, wherever the command starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from heptstudy import paths
from heptstudy.config import HIT_VARIANT, TRACK_CLUSTER_VARIANT, load_config
from heptstudy.errors import ConfigError
from tests.conftest import run_cli

SCENARIO = ["--scenario", "cld_pf_default", "--platform", "local_cpu"]
SMALL_EVAL = ["--set", "data.nvalid=4", "--set", "data.ntest=4"]


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """An empty working directory; what a command leaves in it is checked."""
    here = tmp_path / "work"
    here.mkdir()
    monkeypatch.chdir(here)
    return here


@pytest.fixture
def fake_repo(tmp_path, monkeypatch, tiny_data_dir) -> Path:
    """A repository whose data/tfds holds the tiny data set (16 test events), whatever this
    checkout's data/ holds."""
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "data" / "tfds").symlink_to(tiny_data_dir)
    monkeypatch.setattr(paths, "REPO_ROOT", repo)
    return repo


def _refused(*argv: str) -> str:
    code, out, err = run_cli(*argv)  # run_cli asserts there is no traceback
    assert code == 2 and not out, (code, out, err)
    return err


# ------------------------------------------------------------------ 1: empty render folder


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["scenario", "render", *SCENARIO, "--out", ""], "--out"),
        (["scenario", "render", *SCENARIO, "--out", "  "], "--out"),
        (["scenario", "resolve", *SCENARIO, "--dry-run", "--render-dir", ""], "--render-dir"),
        (["scenario", "resolve", *SCENARIO, "--data-dir", ""], "--data-dir"),
    ],
    ids=["render-out", "render-out-blank", "dry-run-render-dir", "data-dir"],
)
def test_an_empty_folder_option_is_refused_and_nothing_is_written(argv, option, work):
    err = _refused(*argv, *SMALL_EVAL)
    assert f"{option} {argv[-1]!r} is an empty path" in err and "working directory" in err, err
    assert "Give the folder" in err and "nothing was" in err
    assert list(work.iterdir()) == []


def test_render_refuses_an_empty_folder_as_a_library_call_too(work):
    from heptstudy.scenario import render

    with pytest.raises(ConfigError, match=r"--out '' is an empty path"):
        render("cld_pf_default", "local_cpu", "", overrides=["data.nvalid=4", "data.ntest=4"])
    assert list(work.iterdir()) == []


# ----------------------------------------------------------------- 2: empty configured folders


@pytest.mark.parametrize(
    ("override", "key", "default"),
    [
        ("train.out_dir=''", "train.out_dir", "experiments/local/train"),
        ("train.out_dir='  '", "train.out_dir", "experiments/local/train"),
        ("data.data_dir=''", "data.data_dir", "data/tfds"),
    ],
)
def test_config_refuses_an_empty_folder(override, key, default, work):
    value = override.split("=", 1)[1]
    err = _refused("config", "show", "--set", override)
    assert f"key {key}={value} is not allowed: an empty or blank path" in err, err
    assert f"for example the default {default!r}" in err
    with pytest.raises(ConfigError, match=key):
        load_config(overrides=[override])
    assert load_config(overrides=["train.out_dir=."]).train.out_dir == str(work)  # meant: kept


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("train.out_dir=''", "key train.out_dir='' is not allowed: an empty or blank path"),
        ("train.out_dir=null", "key train.out_dir=null is not allowed"),
        ("train.out_dir=5", "key train.out_dir=5 is not allowed"),
        ("data.data_dir=''", "key data.data_dir='' is not allowed: an empty or blank path"),
        ("train=5", "train=5 is not allowed: train is a section of keys"),
    ],
)
def test_a_scenario_refuses_an_empty_or_unusable_out_dir(override, said, work):
    err = _refused("scenario", "resolve", *SCENARIO, *SMALL_EVAL, "--set", override)
    assert said in err, err


# ------------------------------------------------------------ 3: where a relative data dir is


@pytest.mark.parametrize("local_data", [False, True], ids=["no-data-here", "other-data-here"])
def test_the_default_data_dir_is_the_repositorys_wherever_the_command_starts(
    local_data, fake_repo, work
):
    from heptstudy.scenario import resolve

    if local_data:  # a data/tfds of the working directory is not the one a run reads
        (work / "data" / "tfds").mkdir(parents=True)
    res = resolve("cld_pf_default", "local_cpu", overrides=["data.nvalid=4", "data.ntest=4"])
    for v in res.variants:
        assert v.config.data.data_dir == str(fake_repo / "data" / "tfds")
        assert v.test_split.events == 16 and str(fake_repo) in v.test_split.source


def test_fit_reads_the_repositorys_data_and_a_typed_folder_from_the_working_directory(
    fake_repo, work
):
    from heptstudy.fitting.api import FitRequest, resolve_config

    _, rv, _ = resolve_config(FitRequest(platform="h100", per_device_batch=8))
    assert rv.config.data.data_dir == str(fake_repo / "data" / "tfds")
    (work / "mine").symlink_to(fake_repo / "data" / "tfds")
    request = FitRequest(platform="h100", per_device_batch=8, overrides=("data.data_dir=mine",))
    _, rv, _ = resolve_config(request)
    assert rv.config.data.data_dir == str(work / "mine")


@pytest.mark.parametrize("how", ["--data-dir", "--set"])
def test_a_typed_data_dir_is_the_working_directorys_and_rendered_so(how, fake_repo, work):
    (work / "mine").mkdir()  # no metadata: the scenario's declared split size applies
    given = ["--data-dir", "mine"] if how == "--data-dir" else ["--set", "data.data_dir=mine"]
    argv = ["scenario", "render", *SCENARIO, "--variant", HIT_VARIANT, "--out", "r", *given]
    code, out, err = run_cli(*argv)
    assert code == 0, err
    rendered = yaml.safe_load((work / "r" / f"{HIT_VARIANT}.yaml").read_text())
    # the rendered file names the folder meant, not one `heptstudy train` would find elsewhere
    assert rendered["data"]["data_dir"] == str(work / "mine")
    assert "(declared)" in out


def test_a_typed_data_dir_that_is_not_in_the_working_directory_is_refused(fake_repo, work):
    # it is in the repository (data/tfds), but typed relative, it is taken from here
    err = _refused("scenario", "resolve", *SCENARIO, *SMALL_EVAL, "--data-dir", "data/tfds")
    assert "[rule data-dir-exists]" in err and repr(str(work / "data" / "tfds")) in err, err


# -------------------------------------------------------- 4: options of the dry run, --resume


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--render-dir", "r"], "--render-dir only applies with --dry-run"),
        (["--resume", "missing.pt"], "--resume only applies with --dry-run"),
        (["--variant", HIT_VARIANT, "--resume", "notes.txt"], "--resume only applies"),
        (["--render-dir", "r", "--resume", "x.pt"], "--render-dir and --resume only apply"),
    ],
    ids=["render-dir", "resume-two-variants", "resume-text", "both"],
)
def test_resolve_without_dry_run_refuses_the_dry_runs_options(extra, named, work):
    (work / "notes.txt").write_text("not a checkpoint\n")
    err = _refused("scenario", "resolve", *SCENARIO, *SMALL_EVAL, *extra)
    assert named in err and "Add --dry-run" in err, err
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("command", ["resolve", "render"])
@pytest.mark.parametrize("name", ["notes.txt", "state"])
def test_a_resume_file_that_is_no_checkpoint_is_refused(command, name, work):
    (work / name).write_text("epoch 1 loss 0.5\n")
    mode = ["--dry-run", "--render-dir", "r"] if command == "resolve" else ["--out", "r"]
    argv = ["scenario", command, *SCENARIO, *SMALL_EVAL, *mode]
    err = _refused(*argv, "--variant", TRACK_CLUSTER_VARIANT, "--resume", name)
    assert f"--resume {name!r} ({work / name}) is not a training-state file" in err, err
    assert "step_NNNNNN.pt" in err and "nothing was rendered" in err
    assert sorted(p.name for p in work.iterdir()) == [name]
