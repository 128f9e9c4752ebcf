"""One rule for every output a user points somewhere (heptstudy.atomic.Output): a file heptstudy
did not write is refused, named and left byte-identical; heptstudy's own earlier output is
replaced. ``scenario render --resume`` takes one existing checkpoint for one variant. Every
default output lies under one root that git ignores."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from heptstudy.atomic import NotOurs, check_outputs
from heptstudy.cli import build_parser, main
from heptstudy.paths import OUTPUT_ROOT

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "experiments" / "cpu_reference"
RECIPE = "cld_pf_heptv2_batch512_50k"
HIT, TRACK_CLUSTER = "hit_heptv2_grouped_tracker_features", "track_cluster_mlpf"
#: What every refusal of a file in a named folder says to do (the shape shared by all outputs).
ADVICE = "To keep it, give --out another folder; to replace it, move it away first"


@pytest.fixture
def no_data(tmp_path) -> str:
    """An empty data folder: the scenario is resolved on its declared test-split size, whatever
    the repository's data/ holds."""
    (tmp_path / "no-data").mkdir()
    return f"data.data_dir={tmp_path / 'no-data'}"


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _users_files(folder: Path, *names: str) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"my own {name}, kept nowhere else\n")
    (folder / "notes.txt").write_text("another file of mine\n")
    return _snapshot(folder)


def _refused(code: int, err: str, *names: str) -> None:
    assert code == 2, err
    assert ADVICE in err and "nothing was written" in err, err
    assert all(f"{name} exists" in err for name in names), err


# ------------------------------------------------------------- a user's file is refused


def _matrix(tmp_path: Path, data_dir: Path) -> Path:
    from tests.conftest import TINY_MODEL

    run = {"batch_size": 1, "passes": "timing", "overrides": list(TINY_MODEL)}
    matrix = {"name": "t", "defaults": {"data_dir": str(data_dir)}, "runs": [run]}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(matrix))
    return path


def test_study_run_refuses_a_users_report_page_in_a_folder_that_is_no_study(
    tiny_data_dir, tmp_path, capsys
):
    out = tmp_path / "mine"
    before = _users_files(out, "report.html")
    argv = ["study", "run", "--matrix", _matrix(tmp_path, tiny_data_dir), "--out", out]
    code, _, err = _cli(capsys, *argv, "--no-progress")
    _refused(code, err, "report.html")
    assert _snapshot(out) == before  # nothing replaced, moved aside or added


def test_study_aggregate_refuses_a_users_report_page(tmp_path, capsys):
    out = tmp_path / "study"
    before = _users_files(out, "report.html", "comparison.csv")
    shutil.copy(REFERENCE / "baseline_b1.json", out)
    before = _snapshot(out)
    code, _, err = _cli(capsys, "study", "aggregate", "--out", out)
    _refused(code, err, "report.html", "comparison.csv")
    assert _snapshot(out) == before


def test_scenario_render_refuses_a_users_configuration_and_lists(tmp_path, capsys, no_data):
    out = tmp_path / "render"
    before = _users_files(out, f"{HIT}.yaml", "launch_scripts.txt", "resolution.json")
    argv = ["scenario", "render", "--scenario", RECIPE, "--platform", "local_cpu", "--out", out]
    code, _, err = _cli(capsys, *argv, "--set", no_data)
    _refused(code, err, f"{HIT}.yaml", "launch_scripts.txt", "resolution.json")
    assert _snapshot(out) == before


def test_fit_validate_refuses_a_users_files_before_estimating(tmp_path, capsys):
    out = tmp_path / "validation"
    before = _users_files(out, "validation.json", "table.md")
    argv = ["fit", "validate", "--reports", REFERENCE / "baseline_b1.json"]
    code, _, err = _cli(capsys, *argv, "--data-dir", tmp_path / "absent", "--out", out)
    _refused(code, err, "validation.json", "table.md")
    assert _snapshot(out) == before


# ------------------------------------------------ heptstudy's own earlier output is replaced


def test_a_studys_own_page_notebook_and_tables_are_replaced(tmp_path):
    from heptstudy.study.outputs import aggregate_outputs

    for path, _ in aggregate_outputs(REFERENCE):  # written by earlier versions, committed
        shutil.copy(path, tmp_path)
    files = aggregate_outputs(tmp_path)
    assert check_outputs(files, "--out") == [path for path, _ in files]


def test_the_report_page_nbconvert_writes_now_is_recognised_as_its_own(tmp_path):
    import nbformat

    from heptstudy.study.runner import render_html

    notebook = tmp_path / "aggregate.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("hi")]), notebook)
    page = render_html(notebook, tmp_path / "report.html")
    first = page.read_bytes()
    notebook.write_text(notebook.read_text().replace('"hi"', '"again"'))
    render_html(notebook, page)  # refused, were the first page not recognised as its own
    assert page.read_bytes() != first and b"again" in page.read_bytes()


def test_the_aggregate_notebook_carries_the_mark_its_executions_keep():
    from heptstudy.study.outputs import AGGREGATE_NOTEBOOK

    assert AGGREGATE_NOTEBOOK.check(ROOT / "notebooks" / "aggregate.ipynb", in_folder=True)


def test_fit_validates_own_files_are_replaced(tmp_path):
    import json

    from heptstudy.estimate import validation

    committed = ROOT / "experiments" / "estimate_validation"
    for name in ("validation.json", "table.md"):  # an earlier version's, other columns
        shutil.copy(committed / name, tmp_path)
    doc = json.loads((committed / "validation.json").read_text())
    doc["rows"] = doc["rows"][:1]
    validation.write_outputs(doc, tmp_path)
    assert json.loads((tmp_path / "validation.json").read_text())["rows"] == doc["rows"]
    assert (tmp_path / "table.md").read_text() == validation.table(doc) + "\n"


def test_a_render_replaces_its_own_files(tmp_path, no_data):
    from heptstudy.scenario.render import render

    render(RECIPE, "local_cpu", tmp_path, overrides=[no_data, "train.lr=0.001"])
    render(RECIPE, "local_cpu", tmp_path, overrides=[no_data, "train.lr=0.002"])
    config = yaml.safe_load((tmp_path / f"{HIT}.yaml").read_text())
    assert config["train"]["lr"] == 0.002
    (tmp_path / "launch_scripts.txt").write_text("echo my own command\n")
    with pytest.raises(NotOurs, match="launch_scripts.txt exists"):
        render(RECIPE, "local_cpu", tmp_path, overrides=[no_data])


def test_a_file_name_output_keeps_its_shape(tmp_path):
    from heptstudy.estimate.memory_model import MODEL_FILE

    mine = tmp_path / "model.json"
    mine.write_text("{}\n")
    with pytest.raises(NotOurs) as err:
        MODEL_FILE.check(mine, "--save-model")
    advice = "To keep it, give --save-model another file name ending in .json; to replace it"
    assert advice in str(err.value) and mine.read_text() == "{}\n"


# ---------------------------------------------------------------------- render --resume


def _render(capsys, out: Path, no_data: str, *extra) -> tuple[int, str, str]:
    argv = ["scenario", "render", "--scenario", RECIPE, "--platform", "local_cpu", "--out", out]
    return _cli(capsys, *argv, "--set", no_data, *extra)


def test_render_refuses_a_checkpoint_that_does_not_exist(tmp_path, capsys, no_data):
    missing = tmp_path / "step_000004.pt"
    code, _, err = _render(capsys, tmp_path / "r", no_data, "--variant", HIT, "--resume", missing)
    assert code == 2 and f"--resume {str(missing)!r}" in err and "does not exist" in err, err
    assert not (tmp_path / "r").exists()


def test_render_refuses_one_checkpoint_for_several_variants(tmp_path, capsys, no_data):
    ckpt = tmp_path / "step_000004.pt"
    ckpt.write_bytes(b"state")
    code, _, err = _render(capsys, tmp_path / "r", no_data, "--resume", ckpt)
    assert code == 2 and HIT in err and TRACK_CLUSTER in err and "--variant NAME" in err, err
    assert not (tmp_path / "r").exists()


def test_each_variant_resumes_from_its_own_checkpoint(tmp_path, capsys, no_data):
    out = tmp_path / "r"
    ckpts = {v: tmp_path / v / "step_000004.pt" for v in (HIT, TRACK_CLUSTER)}
    for variant, ckpt in ckpts.items():
        ckpt.parent.mkdir()
        ckpt.write_bytes(b"state")
        code, _, err = _render(capsys, out, no_data, "--variant", variant, "--resume", ckpt)
        assert code == 0, err
    for variant, ckpt in ckpts.items():
        script = (out / f"{variant}.sh").read_text()
        others = [str(c) for v, c in ckpts.items() if v != variant]
        assert f"--resume {ckpt}" in script and not any(o in script for o in others)


# ------------------------------------------------------------------------ default outputs


def _ignored_and_untracked(relative: Path) -> bool:
    inside = str(relative / "any-file")
    ignored = subprocess.run(["git", "check-ignore", "-q", inside], cwd=ROOT)
    tracked = subprocess.run(["git", "ls-files", str(relative)], cwd=ROOT, capture_output=True)
    return ignored.returncode == 0 and tracked.stdout == b""


def _study_run() -> Path:
    from heptstudy.study.outputs import default_study_dir

    return default_study_dir().relative_to(ROOT)


def _study_predict() -> Path:
    argv = ["study", "predict", "--matrix", "m.yaml", "--data-dir", "d"]
    return Path(build_parser().parse_args(argv).out).parent


def _data_stats() -> Path:
    from heptstudy.cli.data import DEFAULT_STATS_DIR

    return Path(DEFAULT_STATS_DIR)


def _pipeline() -> Path:
    from heptstudy.study.pipeline import PipelineParameters

    return Path(PipelineParameters().out_dir)


def _pipeline_notebook() -> Path:
    import ast

    import papermill

    parameters = papermill.inspect_notebook(str(ROOT / "notebooks" / "pipeline.ipynb"))
    return Path(ast.literal_eval(parameters["out_dir"]["default"]))


def _bench() -> Path:
    from heptstudy.measure.request import SCRATCH_DIR

    return SCRATCH_DIR


def _train() -> Path:
    from heptstudy.config import TrainConfig

    return Path(TrainConfig().out_dir)


@pytest.mark.parametrize(
    "default",
    [
        _study_run,
        _study_predict,
        _data_stats,
        _pipeline,
        _pipeline_notebook,
        _bench,
        _train,
    ],
)
def test_a_default_output_is_under_the_root_and_ignored_by_git(default):
    folder = default()
    assert not folder.is_absolute() and folder.is_relative_to(OUTPUT_ROOT), folder
    assert _ignored_and_untracked(folder), folder


def test_a_dry_run_renders_under_the_root(tmp_path, monkeypatch, capsys, no_data):
    monkeypatch.chdir(tmp_path)
    argv = ["scenario", "resolve", "--scenario", RECIPE, "--platform", "local_cpu", "--dry-run"]
    code, _, err = _cli(capsys, *argv, "--set", no_data)
    assert code == 0, err
    (written,) = {p.parent.relative_to(tmp_path) for p in tmp_path.rglob("*.yaml")}
    assert written.is_relative_to(OUTPUT_ROOT) and _ignored_and_untracked(written), written
