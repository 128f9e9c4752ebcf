"""The one measurement request: the same object from the CLI, a notebook and a matrix row; its
parsing of Papermill's strings; its refusals."""

import argparse
import json
from pathlib import Path

import nbformat
import pytest
import yaml
from click.testing import CliRunner
from papermill.cli import papermill

from heptstudy.cli.bench import register_cli, request_from_args
from heptstudy.config import FIXED_PLANS, HEPTv2Config, load_config, load_platform
from heptstudy.measure.request import (
    DEFAULT_STEPS,
    NOTEBOOK_PARAMETERS,
    MeasurementRequest,
    RequestError,
    from_notebook,
)
from heptstudy.study import load_matrix

ROOT = Path(__file__).resolve().parent.parent
CPU = DEFAULT_STEPS["cpu"]


def _cli(argv: list[str]) -> MeasurementRequest:
    parser = argparse.ArgumentParser(prog="heptstudy")
    register_cli(parser.add_subparsers())
    return request_from_args(parser.parse_args(["bench", *argv]))


def _cells(path: Path, tag: str) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if tag in c.metadata.get("tags", [])]


def _parameters_cell(kind: str) -> str:
    (cell,) = _cells(ROOT / "notebooks" / f"{kind}.ipynb", "parameters")
    return cell


def _notebook(tmp_path: Path, kind: str, cli_strings: dict[str, str]) -> MeasurementRequest:
    """What the notebook's first cell builds after ``papermill -p NAME VALUE ...``."""
    options = [arg for name, value in cli_strings.items() for arg in ("-p", name, value)]
    return from_notebook(kind, prepared_namespace(tmp_path, kind, options))


def prepared_namespace(tmp_path: Path, kind: str, options: list[str]) -> dict:
    """The kernel's globals before the notebook's first cell after ``papermill OPTIONS``:
    papermill's own command line (``--prepare-only``: the parameters injected, no kernel
    started), then the parameter cells with the kernel's input history."""
    out = tmp_path / f"prepared_{kind}.ipynb"
    args = [str(ROOT / "notebooks" / f"{kind}.ipynb"), str(out), "--prepare-only", *options]
    result = CliRunner().invoke(papermill, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (cell,) = _cells(out, "parameters")
    (injected,) = _cells(out, "injected-parameters")
    namespace: dict = {}
    exec(cell, namespace)
    exec(injected, namespace)
    namespace["In"] = ["", cell, injected, "request = from_notebook(...)"]
    return namespace


def _matrix(tmp_path, kind: str, row: dict) -> MeasurementRequest:
    path = tmp_path / "m.yaml"
    entry = {**row, **({"notebook": kind} if kind == "parity" else {})}
    path.write_text(yaml.safe_dump({"runs": [entry]}))
    (run,) = load_matrix(path).runs
    return run.request()


# (command line, the same inputs as `papermill -p` strings; the matrix row holds them as strings)
CASES = [
    ("memory", ["--batch-size", "4"], {"batch_size": "4"}),
    (
        "memory",
        [
            "--batch-size",
            "2",
            "--checkpointing",
            "selective",
            "--steps",
            "3",
            "--platform",
            "local_cpu",
            "--dtype",
            "bfloat16",
            "--seed",
            "5",
            "--set",
            "model.heptv2.num_convs=2",
            "--set",
            "train.lr=0.002",
            "--allocator",
            "default",
        ],
        {
            "batch_size": "2",
            "checkpointing": "selective",
            "steps": "3",
            "platform": "local_cpu",
            "dtype": "bfloat16",
            "seed": "5",
            "overrides": "model.heptv2.num_convs=2 train.lr=0.002",
            "allocator": "default",
        },
    ),
    ("memory", ["--batch-size", "1", "--platform", "h100"], {"platform": "h100"}),
    # true is full, a count plan a plan of its own
    (
        "memory",
        ["--batch-size", "3", "--checkpointing", "true"],
        {"batch_size": "3", "checkpointing": "full"},
    ),
    (
        "memory",
        ["--batch-size", "3", "--checkpointing", "layers2"],
        {"batch_size": "3", "checkpointing": "layers2"},
    ),
    ("parity", ["--parity-only", "--deterministic"], {"deterministic": "True"}),
]


@pytest.mark.parametrize(
    "kind,argv,strings", CASES, ids=["defaults", "many", "gpu", "true", "layers2", "parity"]
)
def test_cli_notebook_and_matrix_build_the_same_measurement(tmp_path, kind, argv, strings):
    cli = _cli(argv)
    notebook = _notebook(tmp_path, kind, strings)
    matrix = _matrix(tmp_path, kind, strings)
    assert cli == notebook == matrix
    resolved = cli.resolve()
    assert resolved == notebook.resolve() == matrix.resolve()
    assert resolved.name == cli.name and resolved.config.train.global_batch_size == cli.batch_size


#: Each named plan and its report name's part.
PLANS = {
    "off": "baseline",
    "full": "checkpointed",
    "selective": "checkpointed_selective",
    "every2": "checkpointed_every2",
    "every3": "checkpointed_every3",
    "layers2": "checkpointed_layers2",
    "last1": "checkpointed_last1",
    "auto": "auto",
}


def test_every_fixed_plan_is_listed_here():
    assert set(FIXED_PLANS) < set(PLANS)


@pytest.mark.parametrize("value", [*PLANS, "true", "false", "FULL"])
def test_each_checkpointing_value_is_the_same_measurement_everywhere(tmp_path, value):
    cli = _cli(["--batch-size", "4", "--checkpointing", value])
    notebook = _notebook(tmp_path, "memory", {"batch_size": "4", "checkpointing": value})
    matrix = _matrix(tmp_path, "memory", {"batch_size": 4, "checkpointing": value})
    m = cli.resolve()
    assert m == notebook.resolve() == matrix.resolve()
    plan = {"true": "full", "false": "off"}.get(value.lower(), value.lower())
    part = PLANS[plan]
    assert m.plan.name == m.config.model.heptv2.activation_checkpointing == plan
    assert m.name == f"{part}_b4"
    assert m.report_path == Path("experiments/local/scratch") / f"{part}_b4.json"


def test_yaml_bare_off_and_on_are_booleans_and_still_mean_off_and_full(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "runs:\n  - {batch_size: 2, checkpointing: off}\n  - {batch_size: 2, checkpointing: on}\n"
    )
    assert [r.request().checkpointing for r in load_matrix(path).runs] == ["off", "full"]


def test_batch_size_is_the_training_batch_size():
    config = MeasurementRequest.build(batch_size=16).resolve().config
    assert config.train.global_batch_size == 16 and config.data.nvalid == 16


def test_defaults_are_stated_once_and_depend_on_the_device():
    cpu = _cli(["--platform", "local_cpu"])
    assert (cpu.batch_size, cpu.steps, cpu.warmup) == (1, CPU["steps"], CPU["warmup"])
    gpu = _cli(["--platform", "lumi_mi250x"])
    assert (gpu.steps, gpu.warmup) == (
        DEFAULT_STEPS["cuda"]["steps"],
        DEFAULT_STEPS["cuda"]["warmup"],
    )
    assert _cli(["--platform", "h100", "--steps", "1", "--warmup", "0"]).steps == 1
    many = CASES[1]
    assert _cli(many[1]).name == "checkpointed_selective_b2"


@pytest.mark.parametrize("kind", ["memory", "parity"])
def test_parameters_cell_has_the_request_fields_and_defaults(kind):
    """A notebook's parameter cell is not another source of defaults: it holds the request's."""
    namespace: dict = {}
    exec(_parameters_cell(kind), namespace)
    names = [k for k in namespace if not k.startswith("__")]
    assert set(names) == set(NOTEBOOK_PARAMETERS[kind])
    fields = MeasurementRequest.model_fields
    for name in names:
        assert namespace[name] == fields[name].get_default(call_default_factory=True), name


def test_config_is_built_directly(tmp_path):
    request = MeasurementRequest.build(
        batch_size=3,
        checkpointing=True,
        variant="track_cluster_mlpf",
        platform="h100",
        data_dir=str(tmp_path),
        dtype="float32",
        seed=5,
        overrides=["model.track_cluster.width=64"],
    )
    backend = load_platform(request.platform).attention_backend
    dotted = [
        "train.global_batch_size=3",
        "data.nvalid=3",
        "data.ntest=0",
        f"model.heptv2.attention_backend={backend}",
        "model.variant=track_cluster_mlpf",
        "data.dataset=cld_edm_ttbar_pf:3.2.1",
        f"data.data_dir={tmp_path}",
        "train.dtype=float32",  # the request's dtype wins over the platform's bf16
        "train.seed=5",
        "model.heptv2.activation_checkpointing=true",
        "model.track_cluster.width=64",
    ]
    assert request.resolve().config == load_config(overrides=dotted)


@pytest.mark.parametrize(
    "values,words",
    [
        ({"batch_size": True}, "batch_size=True is not allowed: takes a whole number, not true"),
        ({"batch_size": "true"}, "batch_size='true' is not allowed: takes a whole number, not"),
        ({"steps": False}, "steps=False is not allowed: takes a whole number, not true/false"),
        ({"seed": True}, "give a whole number or null (the default)"),
        ({"batch_size": 2.5}, "batch_size=2.5 is not allowed"),
        ({"batch_size": 0}, "batch_size=0 is not allowed: Input should be greater than or equal"),
        (
            {"checkpointing": 1},
            "checkpointing=1 is not allowed: allowed values are off, full, selective, every2, "
            "every3, layersK or lastK (the first or last K backbone layers), keepNN (every "
            "layer checkpointed, keeping what a solver chose within NN percent of the uncheckpointed "
            "activation memory, NN 0 to 100) or auto (true/false: full/off); a number is not a "
            "checkpointing plan",
        ),
        ({"checkpointing": "every4"}, "allowed values are off, full, selective"),
        (
            {"overrides": ["model.heptv2.activation_checkpointing=every2"]},
            "give checkpointing instead of overriding model.heptv2.activation_checkpointing",
        ),
        ({"overrides": ["train.global_batch_size=8"]}, "give batch_size instead"),
        ({"allocator": "jemalloc"}, "allocator='jemalloc' is not allowed: Input should be 'plat"),
        ({"deterministic": 0}, "deterministic=0 is not allowed: takes true or false, not a number"),
        ({"deterministic": "1"}, "takes true or false, not a number"),
        ({"platform": "h1000"}, "platform='h1000' is not allowed: [rule platform-exists]"),
        ({"overrides": "train.lr"}, "override 'train.lr' is not of the form KEY=VALUE"),
        ({"overrides": 5}, "allowed values are a list of KEY=VALUE strings"),
        ({"batchsize": 4}, "unknown parameter batchsize=4; did you mean 'batch_size'?"),
        ({"kind": "parity", "checkpointing": True}, "checkpointing does not apply to a parity"),
        ({"kind": "parity", "allocator": "default"}, "allocator does not apply to a parity"),
        ({"kind": "timing"}, "kind='timing' is not allowed: Input should be 'memory' or 'parity'"),
        ({"overrides": ["data.data_dir=/x"]}, "give data_dir instead of overriding data.data_dir"),
    ],
)
def test_refusals_name_the_parameter(values, words):
    with pytest.raises(RequestError) as err:
        MeasurementRequest.build(**values)
    assert words in str(err.value)


def test_cli_errors_name_the_option():
    with pytest.raises(RequestError, match=r"--batch-size 'four' is not allowed"):
        _cli(["--batch-size", "four"])
    with pytest.raises(RequestError, match=r"--steps 0 is not allowed"):
        _cli(["--steps", "0"])


@pytest.mark.parametrize("kind", ["memory", "parity"])
def test_misspelled_notebook_parameter_is_refused(tmp_path, kind):
    with pytest.raises(RequestError) as err:
        _notebook(tmp_path, kind, {"batchsize": "4"})
    text = str(err.value)
    assert f"{kind}.ipynb has no parameter batchsize (did you mean batch_size?)" in text
    assert "batch_size" in text and "run it again" in text


def test_notebook_outside_papermill_checks_nothing_extra():
    """In JupyterLab there is no injected cell: the parameters are the notebook's own."""
    namespace: dict = {}
    exec(_parameters_cell("memory"), namespace)
    namespace["In"] = ["", _parameters_cell("memory"), "request = from_notebook(...)"]
    namespace["batch_size"] = 3
    assert from_notebook("memory", namespace).batch_size == 3


def test_request_parses_yaml_and_papermill_forms():
    a = MeasurementRequest.build(batch_size=" 2 ", checkpointing="TRUE", seed="None", dtype="")
    b = MeasurementRequest.build(batch_size=2, checkpointing=True)
    assert a == b


def test_a_plans_name_is_the_only_checkpointing_field(tmp_path):
    """Configuration, request and report: one field each, holding the plan's name."""
    from heptstudy.measure import report as rp
    from heptstudy.measure.bench import report_header

    def checkpoint_fields(names):
        return [n for n in names if "checkpoint" in n]

    assert checkpoint_fields(HEPTv2Config.model_fields) == ["activation_checkpointing"]
    assert checkpoint_fields(MeasurementRequest.model_fields) == ["checkpointing"]
    m = _cli(
        ["--batch-size", "2", "--checkpointing", "every2", "--set", "model.heptv2.num_convs=4"]
    ).resolve()
    header = report_header(m, fresh_process=True, synthetic=True)
    path = rp.write_report(
        rp.BenchReport(kind="memory", status="error", error="x", **header), tmp_path / "r.json"
    )
    data = json.loads(path.read_text())
    assert data["checkpointing"] == {"plan": "every2", "memory_budget_mib": None}
    heptv2 = data["config"]["model"]["heptv2"]
    assert checkpoint_fields(heptv2) == ["activation_checkpointing"]
    assert heptv2["activation_checkpointing"] == "every2"
    assert rp.read_report(path).plan is m.plan
    with pytest.raises(RequestError, match="unknown parameter checkpoint_every"):
        MeasurementRequest.build(checkpoint_every=2)


@pytest.mark.parametrize(
    "command", ["bench", "fit", "train", "study", "costs", "data", "scenario", "config"]
)
def test_every_command_prints_its_help(command, capsys):
    from heptstudy.cli import main

    # argparse formats help strings with %: a bare % in a description breaks --help
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out
