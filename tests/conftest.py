import contextlib
import io
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from heptstudy import stand_ins
from heptstudy.config import load_config


@contextlib.contextmanager
def failing_writes(error: OSError, applies=lambda path: True):
    """Every atomic write to a path for which ``applies(path)`` holds raises ``error``, as a full
    disk would (:func:`heptstudy.stand_ins.write_fault`)."""
    saved, stand_ins._WRITE_FAULT = stand_ins._WRITE_FAULT, (error, applies)
    try:
        yield
    finally:
        stand_ins._WRITE_FAULT = saved


#: A model small enough for many CPU tests, with every structural feature of the real one.
TINY_MODEL = [
    "model.heptv2.embedding_dim=16",
    "model.heptv2.num_heads=2",
    "model.heptv2.width=32",
    "model.heptv2.num_convs=3",
    "model.heptv2.block_size=16",
    "model.heptv2.num_regions=6",
    "model.heptv2.n_hashes=2",
    "model.decoder.num_layers=2",
    "model.decoder.num_queries=12",
    "model.decoder.num_heads=2",
    "model.track_cluster.embedding_dim=16",
    "model.track_cluster.width=32",
    "model.track_cluster.num_heads=2",
    "model.track_cluster.num_layers=2",
    "data.pad_to_multiple=16",
]


if os.environ.get("PYTEST_XDIST_WORKER"):
    # The processes a test starts (kernels, torchrun ranks, the CLI) get one core too: with two
    # workers busy, a second OpenMP thread would only wait for a core, spinning.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _few_threads():
    # Two-core CI: keep intra-op threads predictable across tests; under pytest-xdist each of
    # the two workers gets one core.
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


def ctrl_c_state():
    """The SIGINT and SIGTERM handlers and this thread's blocked signals: what a child inherits."""
    interrupts = (signal.SIGINT, signal.SIGTERM)
    return [signal.getsignal(s) for s in interrupts], signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.fixture(autouse=True)
def _interrupts_left_as_found():
    """A test that leaves Ctrl-C (or SIGTERM) ignored or blocked in the worker would make every
    later subprocess of that worker ignore it too (both are inherited), and the Ctrl-C tests of
    tests/test_reliability_files.py fail far from the cause: this names the test that did it."""
    before = ctrl_c_state()
    yield
    after = ctrl_c_state()
    assert after == before, f"SIGINT/SIGTERM handlers and mask changed: {before} -> {after}"


@pytest.fixture
def tiny_overrides():
    return list(TINY_MODEL)


@pytest.fixture
def tiny_config():
    return load_config(overrides=TINY_MODEL)


def generate_tiny_data(data_dir: Path, events_train: int, events_test: int, seed: int) -> Path:
    """Small generated data sets (hits and pf, builder config 1) in ``data_dir``."""
    from heptstudy.data.generate import generate_datasets

    generate_datasets(
        data_dir,
        events_train=events_train,
        events_test=events_test,
        seed=seed,
        configs=("1",),
        occupancy_scale=0.03,
        progress=False,
    )
    return data_dir


@pytest.fixture(scope="session", autouse=True)
def _subprocess_temp_files_under_pytest(tmp_path_factory):
    """What the tests' commands put in the temporary folder (torchrun's log folders, which it
    leaves behind; multiprocessing's) goes under pytest's own, not the machine's /tmp."""
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmpdir"))


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory):
    """A small generated data set (both hits and pf), shared by the tests of a session."""
    return generate_tiny_data(tmp_path_factory.mktemp("tfds"), 24, 16, seed=7)


def tiny_train_overrides(data_dir, out_dir, **train):
    """Overrides for a short CPU training run of the tiny model on the tiny data set."""
    settings = {
        "global_batch_size": 4,
        "num_steps": 4,
        "val_freq": 2,
        "checkpoint_freq": 2,
        "lr": 0.005,
        "out_dir": str(out_dir),
        **train,
    }
    return TINY_MODEL + [
        f"data.data_dir={data_dir}",
        "data.nvalid=4",
        "data.ntest=4",
        *(f"train.{k}={v}" for k, v in settings.items()),
    ]


def tiny_request(data_dir, output, *, overrides=(), **values):
    """A measurement of the tiny model on ``data_dir``, its report at ``output``."""
    from heptstudy.measure.request import MeasurementRequest

    return MeasurementRequest.build(
        data_dir=str(data_dir),
        overrides=[*TINY_MODEL, *overrides],
        output=str(output),
        progress=False,
        **values,
    )


def set_options(overrides: list[str]) -> list[str]:
    """``--set KEY=VALUE`` options giving ``overrides`` on a command line."""
    return [a for o in overrides for a in ("--set", o)]


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`heptstudy ARGV` in this process: its exit status, output and error output; a user's
    mistake never shows a traceback."""
    from heptstudy.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_:  # argparse refuses its own arguments this way
            code = exit_.code
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


def heptstudy_under_file_limit(
    blocks: int, *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`heptstudy ARGV` in a fresh process of this checkout whose files may not grow past
    ``blocks`` (``ulimit -f``, 1 KiB blocks): a full disk without filling one."""
    root = Path(__file__).resolve().parent.parent
    command = f"ulimit -f {blocks}; exec {shlex.join([sys.executable, '-m', 'heptstudy', *argv])}"
    return subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
    )
