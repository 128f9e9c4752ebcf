"""Training under torchrun (two CPU processes, gloo): a resume continues every rank's own random
sequence, and a step interrupted before its checkpoint leaves no records."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import set_options, tiny_train_overrides

REPO = Path(__file__).resolve().parents[1]
RANKS = 2
#: Checkpoints at steps 2 and 4; the interrupted run stops in step 4, after step 3's record.
STEPS, STOPPED_IN = 4, 4

#: ``heptstudy ARGV`` with Ctrl-C arriving on every rank as step STOPPED_IN starts (the way
#: tests/test_train.py stops a run in process), so that it needs no timing. Rank 1 is slow to
#: clean up: rank 0 ends first, and torchrun's SIGTERM must not cut rank 1's line.
INTERRUPTING = textwrap.dedent(
    f"""
    import os
    import sys
    import time

    import heptstudy.train.trainer as trainer
    from heptstudy.cli import run_command

    real, real_unblock = trainer._step, trainer._unblock_resume

    def step(*args):
        if args[7] == {STOPPED_IN}:
            raise KeyboardInterrupt
        return real(*args)

    def unblock(*args):
        if os.environ["RANK"] == "1":
            time.sleep(2)
        return real_unblock(*args)

    trainer._step, trainer._unblock_resume = step, unblock
    sys.argv[0] = "heptstudy"
    run_command()
    """
)


def _torchrun(*argv, expect_ok: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(RANKS), *map(str, argv)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert (run.returncode == 0) == expect_ok, run.stderr[-3000:]
    return run


def _train_argv(out: Path, data: Path) -> list[str]:
    # dropout on (the default), so that each rank's random sequence counts
    overrides = tiny_train_overrides(data, out, num_steps=STEPS, val_freq=2, checkpoint_freq=2)
    return ["train", "--no-progress", *set_options(overrides)]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _train_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss_total"] for r in _records(out) if r["kind"] == "train"}


@pytest.fixture(scope="module")
def runs(tiny_data_dir, tmp_path_factory):
    """An uninterrupted run; the same run interrupted in step 4, as it was left, then resumed
    from its step-2 checkpoint."""
    root = tmp_path_factory.mktemp("ranks")
    whole, stopped = root / "whole", root / "stopped"
    _torchrun("-m", "heptstudy.cli", *_train_argv(whole, tiny_data_dir))
    script = root / "interrupting.py"
    script.write_text(INTERRUPTING)
    interrupted = _torchrun(script, *_train_argv(stopped, tiny_data_dir), expect_ok=False)
    left = _records(stopped)
    checkpoint = stopped / "checkpoints" / "step_000002.pt"
    resumed = _torchrun(
        "-m", "heptstudy.cli", *_train_argv(stopped, tiny_data_dir), "--resume", checkpoint
    )
    return {
        "whole": whole,
        "stopped": stopped,
        "interrupted_stderr": interrupted.stderr,
        "left": left,
        "resumed_stdout": resumed.stdout,
    }


def test_a_resume_continues_each_rank_s_own_random_sequence(runs):
    state = torch.load(runs["stopped"] / "checkpoints" / "step_000002.pt", weights_only=True)
    by_rank = state["rng"]["by_rank"]
    assert state["rng"]["world_size"] == RANKS and len(by_rank) == RANKS
    # the ranks' dropout masks differ: restoring rank 0's state on both would change step 3
    assert not torch.equal(by_rank[0]["torch"], by_rank[1]["torch"])
    whole, resumed = _train_losses(runs["whole"]), _train_losses(runs["stopped"])
    assert sorted(resumed) == sorted(whole) == list(range(1, STEPS + 1))
    assert resumed == whole  # exactly: every loss of the resumed steps as uninterrupted


def test_an_interrupted_step_leaves_no_records_and_a_resume_no_duplicates(runs):
    said = [
        line
        for line in runs["interrupted_stderr"].splitlines()
        if line.startswith("heptstudy: interrupted:")
    ]
    assert len(said) == RANKS and all("step_000002.pt" in line for line in said), said
    # step 3 was recorded before the interrupt in step 4: not kept, as the message says
    assert sorted({r["step"] for r in runs["left"]}) == [1, 2]
    steps = [r["step"] for r in _records(runs["stopped"]) if r["kind"] == "train"]
    assert steps == list(range(1, STEPS + 1))
    validations = [r["step"] for r in _records(runs["stopped"]) if r["kind"] == "validation"]
    assert validations == [2, 4]


def test_a_resume_with_another_number_of_processes_is_refused(runs, tiny_data_dir, tmp_path):
    from heptstudy.config import load_config
    from heptstudy.errors import HeptstudyError
    from heptstudy.train.trainer import train

    out = tmp_path / "one"
    one = load_config(overrides=tiny_train_overrides(tiny_data_dir, out, num_steps=STEPS))
    checkpoint = runs["whole"] / "checkpoints" / "step_000002.pt"
    with pytest.raises(HeptstudyError) as err:
        train(one, resume=checkpoint, progress=False)
    said = str(err.value)
    assert f"a run of {RANKS} processes and this one has 1" in said, said
    assert "--new-run" in said and "nothing was written" in said
    assert not out.exists()


def test_ctrl_c_of_the_launcher_leaves_one_line_per_process(tiny_data_dir, tmp_path):
    """``heptstudy train --nproc-per-node 2``, Ctrl-C in the terminal (the whole foreground
    group): each process says what was kept, torchrun adds no traceback, and the records end
    at the checkpoint named."""
    out = tmp_path / "run"
    overrides = tiny_train_overrides(tiny_data_dir, out, num_steps=500, checkpoint_freq=2)
    command = [sys.executable, "-m", "heptstudy", "train", "--no-progress"]
    command += [*set_options(overrides), "--nproc-per-node", str(RANKS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "step_000002.pt").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGINT, err
    lines = err.splitlines()
    # A rank that has finished its step's all-reduce may be one step ahead of the other when
    # the signal lands; each names its own step, and both name the same kept checkpoint.
    during = [re.search(r"during step (\d+)", line) for line in lines]
    assert len(lines) == RANKS and all(during), err
    steps = [int(found.group(1)) for found in during]
    assert max(steps) - min(steps) <= 1, err
    assert len({re.sub(r"during step \d+", "", line) for line in lines}) == 1, err
    kept = re.search(r"heptstudy: interrupted: .* --resume (\S+step_(\d{6})\.pt)$", lines[0])
    assert kept and Path(kept.group(1)).is_file(), err
    assert max(r["step"] for r in _records(out)) == int(kept.group(2))
