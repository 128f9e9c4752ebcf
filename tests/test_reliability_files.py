"""No file destroyed by a name or a kill, no data set broken by a race (issue 44): one test per
mechanism, each by behaviour.

* every user-named output replaces only its own kind of file;
* papermill's executed notebooks appear whole or not at all;
* one lock per folder a command writes into, data directories included;
* a data set is checked against its folder and files on open, and empty events are named;
* sizes that cannot fit are refused before anything is allocated;
* Ctrl-C ends a command with one line, no traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heptstudy.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------ outputs


@pytest.mark.parametrize(
    "name,content,fragments",
    [
        ("README.md", "# my notes\n", ["written to a .json file", "README.json"]),
        ("notes.json", '{"mine": 1}\n', ["is not a heptstudy bench report", "To keep it"]),
    ],
    ids=["not-json", "foreign-json"],
)
def test_bench_output_never_replaces_a_file_that_is_not_a_report(
    name, content, fragments, tmp_path, capsys
):
    target = tmp_path / name
    target.write_text(content)
    code, _, err = _cli(capsys, "bench", "--batch-size", "1", "--output", target)
    assert code == 2
    assert all(f in err for f in fragments), err
    assert target.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_report_replaces_a_report_and_nothing_else(tmp_path):
    from heptstudy.atomic import NotOurs
    from heptstudy.measure import report as rp

    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"other": "tool"}\n')
    text = rp.REPORT_FILE.mark.decode() + "\n"
    own = tmp_path / "own.json"
    own.write_text("{" + text + "}")
    assert rp.REPORT_FILE.check(own) is True
    with pytest.raises(NotOurs, match="is not a heptstudy bench report"):
        rp.REPORT_FILE.check(foreign)
    assert foreign.read_text() == '{"other": "tool"}\n'
    assert rp.REPORT_FILE.check(tmp_path / "absent.json") is False


def test_a_figure_replaces_a_figure_and_nothing_else(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from heptstudy.atomic import NotOurs, atomic_savefig

    fig, _ = plt.subplots()
    photo = tmp_path / "photo.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(NotOurs, match="not a matplotlib png figure"):
        atomic_savefig(fig, photo)
    assert photo.read_bytes() == b"\x89PNG\r\n\x1a\n" + b"\0" * 100
    for suffix in ("png", "pdf"):
        atomic_savefig(fig, tmp_path / f"f.{suffix}")
        atomic_savefig(fig, tmp_path / f"f.{suffix}")  # its own: replaced
    plt.close(fig)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_data_stats_writes_under_the_working_directory_and_keeps_foreign_files(
    tiny_data_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = ("data", "stats", "--data-dir", tiny_data_dir)
    code, out, err = _cli(capsys, *argv)
    assert code == 0, err
    folder = tmp_path / "experiments" / "local" / "data_stats"
    js = folder / "cld_edm_ttbar_hits_train_stats.json"
    assert js.is_file() and js.with_suffix(".png").is_file()
    code, out, err = _cli(capsys, *argv)
    assert code == 0 and "replace the statistics" in out, err
    js.write_text('{"someone": "else"}\n')
    png_before = js.with_suffix(".png").read_bytes()
    code, _, err = _cli(capsys, *argv)
    assert code == 2 and "is not a heptstudy data statistics file" in err
    assert js.read_text() == '{"someone": "else"}\n'
    assert js.with_suffix(".png").read_bytes() == png_before


def _notebook(path: Path, *cells: str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path


def test_a_killed_notebook_run_leaves_the_previous_executed_notebook(tmp_path):
    slow = _notebook(tmp_path / "slow.ipynb", "print('started')", "import time; time.sleep(60)")
    out = tmp_path / "aggregate.ipynb"
    out.write_text("the finished previous notebook")
    code = (
        "import sys; from heptstudy.study.runner import execute_notebook; "
        "execute_notebook(sys.argv[1], sys.argv[2], kernel_name='python3', progress_bar=False)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, slow, out], env=env)
    try:
        deadline = time.monotonic() + 120
        # papermill has written the first cell's output into its (temporary) notebook
        while not any(b"started" in p.read_bytes() for p in tmp_path.glob(".aggregate.ipynb.*")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert out.read_text() == "the finished previous notebook"
    from heptstudy.atomic import remove_leftovers

    remove_leftovers(out, ".ipynb")  # what the next run, holding the folder, clears
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aggregate.ipynb", "slow.ipynb"]


def test_a_notebook_that_fails_is_put_in_place_whole(tmp_path):
    from papermill.exceptions import PapermillExecutionError

    from heptstudy.study.runner import execute_notebook

    failing = _notebook(tmp_path / "f.ipynb", "raise ValueError('the reason')")
    out = tmp_path / "out.ipynb"
    with pytest.raises(PapermillExecutionError):
        execute_notebook(failing, out, kernel_name="python3", progress_bar=False)
    assert "the reason" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.ipynb", "out.ipynb"]


def test_the_pipeline_never_clears_a_folder_a_run_holds(tmp_path):
    from heptstudy.locks import FolderInUse, holding
    from heptstudy.study.pipeline import fresh_output_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    with holding(run, "train.out_dir"), pytest.raises(FolderInUse, match="in use by another run"):
        fresh_output_dir(run)
    assert (run / "metrics.jsonl").read_text() == "{}\n"


# -------------------------------------------------------------------------------- locks


def _generate_argv(data_dir: Path, train: int) -> list[str]:
    return [
        *(sys.executable, "-m", "heptstudy", "data", "generate", "--data-dir", str(data_dir)),
        *("--events-train", str(train), "--events-test", "4", "--seed", "3"),
        *("--occupancy-scale", "0.03", "--workers", "1", "--no-progress"),
    ]


def _text_or_empty(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_a_second_generator_into_one_data_directory_is_refused(tmp_path):
    from heptstudy.data.tfds import open_dataset
    from heptstudy.locks import LOCK_NAME

    data = tmp_path / "tfds"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(_generate_argv(data, 40), env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # the holder's pid is written once the lock is taken (the file exists a moment before)
        while f'"pid": {first.pid},' not in _text_or_empty(data / LOCK_NAME):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)  # mid-generation, holding the data directory
        second = subprocess.run(_generate_argv(data, 8), env=env, capture_output=True, text=True)
    finally:
        first.send_signal(signal.SIGCONT)
    out, _ = first.communicate(timeout=120)
    assert second.returncode == 2, second.stderr
    assert f"pid {first.pid}" in second.stderr and "in use by another run" in second.stderr
    assert first.returncode == 0 and "wrote 40 train + 4 test" in out
    for name in ("cld_edm_ttbar_hits", "cld_edm_ttbar_pf"):
        for split, n in (("train", 40), ("test", 4)):
            ds = open_dataset(data, f"{name}:3.2.1", ["1"], split)
            assert len(ds) == n and len(ds.lengths()) == n  # every event reads
    assert not (data / LOCK_NAME).exists()


# -------------------------------------------------------------------- data sets on open


def _copy_of(data_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    copy = tmp_path / "tfds"
    shutil.copytree(data_dir, copy)
    return copy, copy / "cld_edm_ttbar_hits" / "1" / "3.2.1"


@pytest.mark.parametrize(
    "edit,fragments",
    [
        (lambda info, folder: info.update(version="9.9.9"), ["version '9.9.9'", "'3.2.1'"]),
        (lambda info, folder: info.update(configName="2"), ["config '2'"]),
        (
            lambda info, folder: (
                folder / "cld_edm_ttbar_hits-train.array_record-00001-of-00002"
            ).write_bytes(b""),
            ["00001-of-00002", "disagree with the files"],
        ),
    ],
    ids=["version", "config", "unlisted-shard"],
)
def test_a_data_set_that_contradicts_its_folder_is_refused(
    edit, fragments, tiny_data_dir, tmp_path
):
    from heptstudy.data.tfds import open_dataset
    from heptstudy.errors import DataError

    data, folder = _copy_of(tiny_data_dir, tmp_path)
    meta = folder / "dataset_info.json"
    info = json.loads(meta.read_text())
    edit(info, folder)
    meta.write_text(json.dumps(info))
    with pytest.raises(DataError) as err:
        open_dataset(data, "cld_edm_ttbar_hits:3.2.1", ["1"], "train")
    assert all(f in str(err.value) for f in fragments), err.value


def test_bench_names_empty_events_and_measures_nothing(tiny_data_dir, tmp_path, capsys):
    import numpy as np

    from heptstudy.data.tfds import HITS_NAME, ArrayRecordDatasetWriter, features_dict, open_dataset

    data = tmp_path / "tfds"
    sources = {
        s: open_dataset(tiny_data_dir, f"{HITS_NAME}:3.2.1", ["1"], s) for s in ("train", "test")
    }
    writer = ArrayRecordDatasetWriter(
        data, HITS_NAME, "1", {s: len(d) for s, d in sources.items()}, {"synthetic": True}, "t"
    )
    for split, ds in sources.items():
        for i in range(len(ds)):
            ev = {k: v for k, v in ds[i].items() if k != "event_index"}
            if split == "train" and i % 2 == 0:  # every other event without hits
                for key in ("X", "ytarget", "ycand"):
                    ev[key] = ev[key][:0]
            writer.add_serialized(split, features_dict(HITS_NAME).serialize_example(ev))
    writer.finish()
    writer.publish()
    report = tmp_path / "r.json"
    argv = ["bench", "--batch-size", "2", "--passes", "timing", "--steps", "2", "--warmup", "0"]
    code, _, err = _cli(capsys, *argv, "--data-dir", data, "--output", report, "--no-progress")
    assert code == 2, err
    assert "hold no hits" in err
    assert re.search(rf"{HITS_NAME}/1 train event (\d*[02468]) \(global index \1\)", err), err
    assert "nothing was measured" in err and not report.exists()
    assert np.all(open_dataset(data, f"{HITS_NAME}:3.2.1", ["1"], "train").lengths()[1::2] > 0)


# ---------------------------------------------------------------------------- interrupts


def _ctrl_c_as_a_terminal_gives_it():
    """In the child before it starts: Ctrl-C handled by default and not blocked, whatever pytest
    inherited (a background job of a shell without job control ignores SIGINT, and so would the
    command under test; tests/conftest.py names a test that changes it in the worker)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def _interrupt(argv: list[str], started, *, group: bool = True, cwd: Path = ROOT):
    """Run ``heptstudy ARGV`` in a session of its own, Ctrl-C it (the whole foreground group, or
    the process alone) once ``started(children)`` says so; return (exit code, stdout, stderr,
    seconds from the signal to the exit, the children it had)."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "heptstudy", *map(str, argv)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_a_terminal_gives_it,
    )
    me = psutil.Process(proc.pid)
    deadline = time.monotonic() + 240
    try:
        while not started(children := me.children(recursive=True)):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT) if group else proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        return proc.returncode, out, err, time.monotonic() - t0, children
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("heptstudy: interrupted:")]
    assert len(lines) == 1 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    return lines[0]


@pytest.mark.parametrize("group", [True, False], ids=["foreground-group", "runner-alone"])
def test_ctrl_c_stops_a_study_run_and_its_kernel(group, tiny_data_dir, tmp_path):
    import psutil
    import yaml

    from tests.conftest import TINY_MODEL

    matrix = tmp_path / "m.yaml"
    run = {"batch_size": 1, "passes": "timing", "overrides": list(TINY_MODEL)}
    defaults = {"data_dir": str(tiny_data_dir), "steps": 5, "warmup": 0}
    matrix.write_text(yaml.safe_dump({"name": "t", "defaults": defaults, "runs": [run]}))
    out = tmp_path / "study"
    argv = ["study", "run", "--matrix", matrix, "--out", out, "--no-progress"]

    def kernel_busy(children) -> bool:  # the kernel has started its notebook
        return bool(children) and any(out.glob(".pending/notebooks/.*.ipynb"))

    code, _, err, seconds, children = _interrupt(argv, kernel_busy, group=group)
    assert code == -signal.SIGINT and seconds < 20, (code, seconds, err)
    line = _one_line(err)
    assert "none of the 1 runs had finished" in line and "run the same command again" in line
    time.sleep(1)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not list(out.glob("*.json")) and not list(out.glob("notebooks/*.ipynb"))
    assert not [p for p in out.rglob("*") if p.is_file() and p.name != "matrix.yaml"]
    assert not (out / ".heptstudy.lock").exists()


def test_ctrl_c_during_training_says_how_to_resume(tiny_data_dir, tmp_path):
    from tests.conftest import tiny_train_overrides

    out = tmp_path / "run"
    overrides = tiny_train_overrides(tiny_data_dir, out, num_steps=500, checkpoint_freq=2)
    argv = ["train", "--no-progress", *(a for o in overrides for a in ("--set", o))]
    code, _, err, seconds, _ = _interrupt(
        argv, lambda _: (out / "checkpoints" / "step_000002.pt").exists()
    )
    assert code == -signal.SIGINT and seconds < 20, (code, seconds, err)
    line = _one_line(err)
    resume = re.search(r"--resume (\S+step_\d{6}\.pt)", line)
    assert resume and Path(resume.group(1)).is_file(), line
    assert not (out / ".heptstudy.lock").exists()


@pytest.mark.parametrize("wait_s", [0.5, 6.0], ids=["while-loading", "while-measuring"])
def test_ctrl_c_during_a_bench_writes_nothing(wait_s, tiny_data_dir, tmp_path):
    report = tmp_path / "r.json"
    # the full-size model, both passes: a bench no machine ends in the wait, so the Ctrl-C
    # always meets it running
    argv = ["bench", "--batch-size", "1", "--steps", "20", "--warmup", "0"]
    argv += ["--data-dir", tiny_data_dir, "--output", report, "--no-progress"]
    # early or late, Ctrl-C leaves one line and nothing written
    code, _, err, seconds, _ = _interrupt(argv, lambda _: time.sleep(wait_s) or True)
    assert code == -signal.SIGINT and seconds < 20, (code, seconds, err)
    assert "nothing" in _one_line(err)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------- sizes, wording


@pytest.mark.parametrize(
    "argv,fragments",
    [
        (["bench", "backbone", "--hits", "1000000000"], ["--hits 1,000,000,000", "GiB"]),
        (
            ["data", "generate", "--events-train", "1", "--events-test", "1", "--seed", "1"]
            + ["--occupancy-scale", "1e6"],
            ["--occupancy-scale 1e+06", "GiB"],
        ),
    ],
    ids=["backbone-hits", "occupancy"],
)
def test_sizes_beyond_memory_are_refused_before_allocating(argv, fragments, tmp_path, capsys):
    from heptstudy.units import host_memory_available

    if host_memory_available() is None:
        pytest.skip("this system does not say how much memory is available")
    if argv[0] == "data":
        argv += ["--data-dir", tmp_path / "d"]
    code, _, err = _cli(capsys, *argv)
    assert code == 2 and "this host has" in err and "nothing was allocated" in err, err
    assert all(f in err for f in fragments), err
    assert list(tmp_path.iterdir()) == []


def test_a_one_layer_backbone_has_no_count_plan():
    from heptstudy.config import load_config
    from heptstudy.errors import ConfigError

    over = ["model.heptv2.num_convs=1", "model.heptv2.activation_checkpointing=layers1"]
    with pytest.raises(ConfigError) as err:
        load_config(overrides=over)
    assert "1 to 0" not in str(err.value) and "use full or off" in str(err.value)


def test_fit_names_the_variant_it_answers_for(tmp_path, capsys):
    code, _, err = _cli(
        capsys, "fit", "--platform", "local_cpu", "--per-device-batch", "2",
        "--variant", "hit_heptv2_grouped_tracker_features", "--data-dir", tmp_path / "none",
    )  # fmt: skip
    assert code == 2 and "variant hit_heptv2_grouped_tracker_features" in err, err
    assert "track_cluster_mlpf" not in err


@pytest.mark.parametrize("new_run", [False, True], ids=["plain", "new-run"])
def test_a_data_set_folder_is_not_called_a_training_run(new_run, tiny_data_dir, tmp_path):
    from heptstudy.train.out_dir import OutputDirError, choose_out_dir

    folder = tiny_data_dir / "cld_edm_ttbar_hits" / "1" / "3.2.1"
    with pytest.raises(OutputDirError) as err:
        choose_out_dir(folder, new_run=new_run)
    assert "a TFDS data set that no training run wrote" in str(err.value)
    assert "holds an earlier run" not in str(err.value)
    assert not list(folder.glob("run-*"))


@pytest.mark.parametrize(
    "argv",
    [
        ["study", "predict", "--matrix", "m.yaml", "--data-dir", "d", "--out"],
        ["fit", "--platform", "local_cpu", "--per-device-batch", "2", "--save-model"],
        ["bench", "backbone", "--hits", "64", "--output"],
    ],
    ids=["study-predict", "fit-save-model", "bench-backbone"],
)
def test_every_named_json_output_keeps_a_foreign_file(argv, tmp_path, capsys):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}\n')
    code, _, err = _cli(capsys, *argv, notes)
    assert code == 2 and "To keep it" in err and "notes.json" in err, err
    assert notes.read_text() == '{"mine": true}\n'


def test_bench_names_a_bad_value_by_its_option(capsys):
    code, _, err = _cli(capsys, "bench", "--batch-size", "0", "--steps", "x")
    assert code == 2 and "--batch-size 0 is not allowed" in err and "--steps 'x'" in err, err
    assert "parameter batch_size" not in err and "parameter steps" not in err
