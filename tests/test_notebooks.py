"""The notebooks, executed by Papermill with the tiny model and data set (pyhf style).

Each execution starts a fresh ``python3`` kernel from this environment; the whole module takes
a couple of minutes on two cores.
"""

import subprocess
import sys
from pathlib import Path

import nbformat
import papermill as pm
import pytest
import yaml

from heptstudy.measure.report import read_report
from heptstudy.study.runner import execute_notebook
from tests.conftest import TINY_MODEL

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ALL = ("memory", "parity", "pipeline", "explore", "aggregate")


def _papermill_cli(notebook, out, *params, cwd=ROOT):
    """``papermill notebooks/NAME.ipynb out.ipynb -p ... -y ...`` exactly as a user types it."""
    cmd = [
        sys.executable,
        "-m",
        "papermill",
        str(NOTEBOOKS / notebook),
        str(out),
        "--no-progress-bar",
        *params,
    ]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def _tiny_yaml(data_dir, **extra):
    return yaml.safe_dump({"data_dir": str(data_dir), "overrides": TINY_MODEL, **extra})


@pytest.mark.parametrize("name", ALL)
def test_committed_without_outputs_and_parameterised(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), (
        f"{name}.ipynb has outputs"
    )
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{name}.ipynb needs exactly one cell tagged 'parameters'"
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("kind", ["memory", "parity"])
def test_parameters_cell_has_exactly_the_request_parameters(kind):
    """What papermill sees in the parameters cell is what the measurement request takes."""
    from heptstudy.measure.request import NOTEBOOK_PARAMETERS

    params = pm.inspect_notebook(str(NOTEBOOKS / f"{kind}.ipynb"))
    assert set(params) == set(NOTEBOOK_PARAMETERS[kind])


def test_memory_notebook_checkpointing_string(tiny_data_dir, tmp_path):
    """``-p checkpointing true`` arrives as a string and means full (``false`` and every other
    spelling: tests/test_request.py, the same resolution without a kernel); the kernel applies
    local_cpu's allocator settings itself."""
    params = tmp_path / "tiny.yaml"
    params.write_text(_tiny_yaml(tiny_data_dir))
    report_path = tmp_path / "report.json"
    res = _papermill_cli(
        "memory.ipynb",
        tmp_path / "out.ipynb",
        "-p",
        "batch_size",
        "2",
        "-p",
        "checkpointing",
        "true",
        "-p",
        "steps",
        "1",
        "-p",
        "warmup",
        "1",
        "-p",
        "output",
        str(report_path),
        "-f",
        str(params),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = read_report(report_path)
    assert report.status == "ok" and report.kind == "memory"
    assert report.name == "checkpointed_b2"
    assert report.checkpointing.plan == "full"
    assert report.config["model"]["heptv2"]["activation_checkpointing"] == "full"
    assert report.batch_size == report.config["train"]["global_batch_size"] == 2
    assert report.summary.counted_steps == 1
    local_cpu = yaml.safe_load((ROOT / "configs/training/platforms/local_cpu.yaml").read_text())
    assert report.environment.allocator_settings == local_cpu["env"]
    assert report.environment.allocator_applied["MALLOC_TOP_PAD_"] == 2**30
    assert set(report.summary.mean_phase_time_s) == {
        "backbone_forward",
        "decoder_and_heads",
        "loss",
        "backward",
        "optimizer",
    }
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    images = [
        o
        for c in executed.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/png" in o.get("data", {})
    ]
    assert images, "the memory notebook draws its figures"


def test_parity_notebook(tiny_data_dir, tmp_path):
    report_path = tmp_path / "parity.json"
    execute_notebook(
        str(NOTEBOOKS / "parity.ipynb"),
        str(tmp_path / "parity.ipynb"),
        kernel_name="python3",
        progress_bar=False,
        cwd=str(ROOT),
        parameters={
            "batch_size": 1,
            "deterministic": "True",
            "data_dir": str(tiny_data_dir),
            "overrides": TINY_MODEL,
            "output": str(report_path),
        },
    )
    report = read_report(report_path)
    assert (
        report.kind == "parity"
        and report.status == "ok"
        and report.name == "parity_deterministic_b1"
    )
    assert report.parity.deterministic is True
    assert report.parity.checkpointed_vs_baseline.num_gradients > 0
    assert report.parity.checkpointed_vs_baseline.loss.equal


def _first_cell_error(executed: Path):
    nb = nbformat.read(executed, as_version=4)
    tags = [c.get("metadata", {}).get("tags", []) for c in nb.cells]
    last = max(i for i, t in enumerate(tags) if "parameters" in t or "injected-parameters" in t)
    # the first code cell after the parameters (papermill puts a markdown error banner before it)
    after = next(i for i in range(last + 1, len(nb.cells)) if nb.cells[i].cell_type == "code")
    errors = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]
    return after, errors, nb


@pytest.mark.parametrize(
    "name,value,allowed",
    [("checkpointing", "maybe", "off, full, selective"), ("batch_size", "four", "valid integer")],
)
def test_bad_parameter_stops_in_first_cell(tmp_path, name, value, allowed):
    out = tmp_path / "bad.ipynb"
    res = _papermill_cli(
        "memory.ipynb", out, "-p", name, value, "-p", "output", str(tmp_path / "r.json")
    )
    assert res.returncode != 0
    after, errors, nb = _first_cell_error(out)
    assert errors == [after], "the first cell after the parameters must be the one that fails"
    err = next(o for o in nb.cells[after].outputs if o.output_type == "error")
    assert err.ename == "RequestError"
    assert f"parameter {name}=" in err.evalue and allowed in err.evalue
    assert "RequestError" in res.stderr and name in res.stderr
    assert not (tmp_path / "r.json").exists()


def test_misspelled_parameter_is_refused(tmp_path):
    """papermill only warns about a parameter the notebook does not have; the notebook refuses
    it instead of measuring batch 1 and exiting 0."""
    out = tmp_path / "bad.ipynb"
    res = _papermill_cli(
        "memory.ipynb", out, "-p", "batchsize", "4", "-p", "output", str(tmp_path / "r.json")
    )
    assert res.returncode != 0
    after, errors, nb = _first_cell_error(out)
    assert errors == [after]
    err = next(o for o in nb.cells[after].outputs if o.output_type == "error")
    assert err.ename == "RequestError"
    assert "memory.ipynb has no parameter batchsize (did you mean batch_size?)" in err.evalue
    assert not (tmp_path / "r.json").exists()


def test_yaml_boolean_parameter(tiny_data_dir, tmp_path):
    """``-y 'checkpointing: yes'`` (a YAML boolean) gets as far as the measurement: the report
    measured full checkpointing."""
    params = tmp_path / "tiny.yaml"
    params.write_text(_tiny_yaml(tiny_data_dir))
    report_path = tmp_path / "report.json"
    res = _papermill_cli(
        "memory.ipynb",
        tmp_path / "out.ipynb",
        "-f",
        str(params),
        "-y",
        f"{{checkpointing: yes, batch_size: 1, steps: 1, warmup: 0, passes: memory, "
        f"output: '{report_path}'}}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = read_report(report_path)
    assert report.status == "ok" and report.name == "checkpointed_b1"
    assert report.checkpointing.plan == "full"
    assert report.config["model"]["heptv2"]["activation_checkpointing"] == "full"


def test_pipeline_notebook(tiny_data_dir, tmp_path):
    """Train / validate / checkpoint, resume from the first checkpoint: the same losses."""
    out = tmp_path / "pipeline.ipynb"
    execute_notebook(
        str(NOTEBOOKS / "pipeline.ipynb"),
        str(out),
        kernel_name="python3",
        progress_bar=False,
        cwd=str(ROOT),
        parameters={
            "out_dir": str(tmp_path / "run"),
            "batch_size": 2,
            "num_steps": 4,
            "checkpointing": "true",
            "data_dir": str(tiny_data_dir),
            "overrides": TINY_MODEL + ["data.nvalid=2", "data.ntest=2"],
        },
    )
    assert (tmp_path / "run" / "checkpoints" / "step_000004.pt").exists()
    assert (tmp_path / "run" / "resume" / "metrics.jsonl").exists()
    assert "resumed losses equal the original ones: True" in out.read_text()


def test_explore_notebook(tiny_data_dir, tmp_path):
    """Pictures of one event, its LSH buckets and the memory timeline of both modes."""
    out = tmp_path / "explore.ipynb"
    execute_notebook(
        str(NOTEBOOKS / "explore.ipynb"),
        str(out),
        kernel_name="python3",
        progress_bar=False,
        cwd=str(ROOT),
        parameters={"data_dir": str(tiny_data_dir), "overrides": TINY_MODEL, "layer": 1},
    )
    nb = nbformat.read(out, as_version=4)
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/png" in o.get("data", {})
    ]
    assert len(images) >= 4  # event, buckets, timeline, categories
