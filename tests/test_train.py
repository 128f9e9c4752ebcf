import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from heptstudy.config import load_config
from heptstudy.errors import HeptstudyError
from heptstudy.measure import bench
from heptstudy.measure import report as rp
from heptstudy.train.out_dir import choose_out_dir
from heptstudy.train.state import ONE_RNG_FORMAT, PARTS, state_digest
from heptstudy.train.trainer import train
from tests.conftest import tiny_request, tiny_train_overrides

REPO = Path(__file__).resolve().parents[1]


def _records(out, kind):
    lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_short_run_lowers_loss_and_writes_everything(tiny_data_dir, tmp_path):
    cfg = load_config(
        overrides=tiny_train_overrides(
            tiny_data_dir, tmp_path, num_steps=16, val_freq=8, checkpoint_freq=8, lr=0.01
        )
    )
    train(cfg, progress=False)
    losses = [r["loss_total"] for r in _records(tmp_path, "train")]
    assert len(losses) == 16
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4
    val = _records(tmp_path, "validation")
    assert [r["step"] for r in val] == [8, 16]
    assert 0.0 <= val[-1]["matched_right_class_fraction"] <= 1.0 and val[-1]["target_particles"] > 0
    assert (tmp_path / "predictions" / "step_000016.npz").is_file()
    assert (tmp_path / "checkpoints" / "step_000008.pt").is_file()
    assert (tmp_path / "config.yaml").is_file()


def test_trainer_and_bench_run_the_same_step(tiny_data_dir, tmp_path):
    """The trainer's first step and the bench's step on the same events, seed and configuration
    (dropout on, so the random sequence counts too): identical losses and gradients."""
    m = tiny_request(
        tiny_data_dir, tmp_path / "bench.json", batch_size=4, steps=1, warmup=0, passes="timing"
    ).resolve()
    config = m.config.model_copy(deep=True)
    config.train.out_dir = str(tmp_path / "train")
    config.train.num_steps = 1
    assert config.model.heptv2.dropout > 0 and config.train.grad_accumulation == 1

    grads: list[list[torch.Tensor | None]] = []  # at each optimizer step, before the update

    def keep_gradients(optimizer, args, kwargs):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        grads.append([None if p.grad is None else p.grad.clone() for p in params])

    hook = register_optimizer_step_pre_hook(keep_gradients)
    try:
        train(config, progress=False)
        bench.run_bench(m)
    finally:
        hook.remove()
    trained = _records(tmp_path / "train", "train")[0]
    measured = rp.read_report(tmp_path / "bench.json").steps[0]
    assert trained["event_index_by_rank"] == [measured.event_indices]
    assert {k: trained[f"loss_{k}"] for k in measured.loss} == measured.loss
    assert len(grads) == 2 and sum(g is not None for g in grads[0]) > 0
    for a, b in zip(*grads, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def _final_state(out):
    return torch.load(Path(out) / "checkpoints" / "step_000004.pt", weights_only=True)


def test_resume_is_bit_for_bit(tiny_data_dir, tmp_path):
    common = ["train.deterministic=true", "model.heptv2.dropout=0.2"]
    full = load_config(overrides=tiny_train_overrides(tiny_data_dir, tmp_path / "full") + common)
    train(full, progress=False)
    resumed = load_config(
        overrides=tiny_train_overrides(tiny_data_dir, tmp_path / "resumed") + common
    )
    checkpoint = tmp_path / "full" / "checkpoints" / "step_000002.pt"
    train(resumed, resume=checkpoint, progress=False)
    # a file written before each process's random state was kept: its one state is restored
    old = torch.load(checkpoint, weights_only=True)
    old["rng"] = old["rng"]["by_rank"][0]
    old.update(format=ONE_RNG_FORMAT, sha256=state_digest({k: old[k] for k in PARTS}))
    torch.save(old, tmp_path / "old_format.pt")
    older = load_config(overrides=tiny_train_overrides(tiny_data_dir, tmp_path / "older") + common)
    train(older, resume=tmp_path / "old_format.pt", progress=False)
    a = _final_state(tmp_path / "full")
    for b in (_final_state(tmp_path / "resumed"), _final_state(tmp_path / "older")):
        for k, v in a["model"].items():
            assert torch.equal(v, b["model"][k]), k
        for pid, st in a["optimizer"]["state"].items():
            for k, v in st.items():
                other = b["optimizer"]["state"][pid][k]
                assert torch.equal(v, other) if torch.is_tensor(v) else v == other
        assert a["loader"] == b["loader"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


class _Stopped(Exception):
    pass


def _stopped_after_step_2(config):
    """A run of ``config`` stopped at step 3, after its step-2 checkpoint."""
    import heptstudy.train.trainer as trainer

    real = trainer._step

    def step(*args):
        if args[7] == 3:
            raise _Stopped
        return real(*args)

    with pytest.MonkeyPatch.context() as patched, pytest.raises(_Stopped):
        patched.setattr(trainer, "_step", step)
        train(config, progress=False)


def test_earlier_run_is_kept_new_runs_are_numbered_and_resume_continues(tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    four = load_config(overrides=tiny_train_overrides(tiny_data_dir, out, num_steps=4))
    _stopped_after_step_2(four)
    first = _snapshot(out)
    assert "checkpoints/step_000002.pt" in first and "checkpoints/step_000004.pt" not in first

    with pytest.raises(HeptstudyError, match="already holds an earlier run.*--new-run"):
        train(four, progress=False)
    assert _snapshot(out) == first

    two = load_config(overrides=tiny_train_overrides(tiny_data_dir, out, num_steps=2))
    summary = train(two, progress=False, new_run=True)
    assert summary["out_dir"] == str(out / "run-002")
    assert {k: v for k, v in _snapshot(out).items() if not k.startswith("run-002")} == first
    assert (out / "run-002" / "checkpoints" / "step_000002.pt").is_file()
    assert choose_out_dir(out, new_run=True) == out / "run-003"
    first = _snapshot(out)

    # resuming continues the run in its own folder: nothing earlier replaced, steps appended; a
    # setting that trades memory for time may change, and the configuration run is recorded
    full = load_config(
        overrides=tiny_train_overrides(tiny_data_dir, out, num_steps=4)
        + ["model.heptv2.activation_checkpointing=full"]
    )
    summary = train(full, resume=out / "checkpoints" / "step_000002.pt", progress=False)
    assert summary["out_dir"] == str(out)
    after = _snapshot(out)
    changed = [k for k, v in first.items() if after[k] != v]
    assert changed == ["metrics.jsonl"]
    assert after["metrics.jsonl"].startswith(first["metrics.jsonl"])
    kinds = [
        (r["kind"], r["step"])
        for r in map(json.loads, after["metrics.jsonl"].decode().splitlines())
    ]
    assert [s for kind, s in kinds if kind == "train"] == [1, 2, 3, 4]
    assert ("resume", 2) in kinds
    assert "checkpoints/step_000004.pt" in after
    assert "config.resumed_step_000002.yaml" in after
    resumed = (out / "config.resumed_step_000002.yaml").read_text()
    assert "activation_checkpointing: full" in resumed

    with pytest.raises(HeptstudyError, match="would replace files of later steps"):
        train(four, resume=out / "checkpoints" / "step_000002.pt", progress=False)
    assert _snapshot(out) == after


@pytest.fixture(scope="module")
def stopped_run(tiny_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("stopped") / "run"
    base = tiny_train_overrides(tiny_data_dir, out, num_steps=4)
    _stopped_after_step_2(load_config(overrides=base))
    return out, base


@pytest.mark.parametrize(
    "override,key,was,now",
    [
        ("train.num_steps=6", "train.num_steps", "4", "6"),
        ("train.lr=0.5", "train.lr", "0.005", "0.5"),
        ("train.weight_decay=0.2", "train.weight_decay", "0.01", "0.2"),
        ("train.lr_final_fraction=0.5", "train.lr_final_fraction", "0.1", "0.5"),
        ("train.loss.momentum_weight=3", "train.loss.momentum_weight", "1.0", "3.0"),
    ],
)
def test_resume_refuses_any_setting_that_changes_the_run(
    override, key, was, now, stopped_run, tiny_data_dir
):
    """A changed schedule, rate or loss weight is named with both values, never applied part
    way; nothing is written."""
    out, base = stopped_run
    before = _snapshot(out)
    changed = load_config(overrides=[*base, override, "train.val_freq=1"])
    with pytest.raises(HeptstudyError) as err:
        train(changed, resume=out / "checkpoints" / "step_000002.pt", progress=False)
    said = str(err.value)
    assert f"{key}: checkpoint {was}, now {now}" in said
    assert "val_freq" not in said  # how often it validates may change
    assert "--new-run" in said and "nothing was written" in said
    assert _snapshot(out) == before


def test_non_finite_loss_stops_with_step_and_events(tiny_data_dir, tmp_path):
    cfg = load_config(
        overrides=tiny_train_overrides(
            tiny_data_dir, tmp_path, lr=1e30, num_steps=6, checkpoint_freq=1
        )
    )
    with pytest.raises(HeptstudyError, match=r"non-finite loss at step \d+ \(events \["):
        train(cfg, progress=False)


def test_torchrun_two_process_gloo_matches_single_process(tiny_data_dir, tmp_path):
    common = [
        "model.heptv2.activation_checkpointing=true",
        "model.heptv2.dropout=0.0",
        "model.decoder.dropout=0.0",
    ]
    single = load_config(
        overrides=tiny_train_overrides(tiny_data_dir, tmp_path / "single", num_steps=1) + common
    )
    train(single, progress=False)
    args = [
        f"--set={o}"
        for o in tiny_train_overrides(tiny_data_dir, tmp_path / "ddp", num_steps=1) + common
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "heptstudy.cli",
        "train",
        "--no-progress",
        *args,
    ]
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    # again into the same folder: rank 0 refuses for both ranks, nothing hangs or changes
    written = _snapshot(tmp_path / "ddp")
    again = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert again.returncode != 0
    assert again.stderr.count("heptstudy: error: train.out_dir=") == 2, again.stderr[-3000:]
    assert _snapshot(tmp_path / "ddp") == written
    a = torch.load(tmp_path / "single" / "checkpoints" / "step_000001.pt", weights_only=True)
    b = torch.load(tmp_path / "ddp" / "checkpoints" / "step_000001.pt", weights_only=True)
    # Gradients agree to float32 rounding; LAMB's first step divides each gradient by its own
    # magnitude, so a gradient that is exactly zero in theory (the attention key bias) turns
    # rounding noise into an update of at most lr * noise / (noise + eps): atol covers that,
    # 0.2% of one learning-rate step (lr = 0.005).
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=1e-5, atol=1e-5, msg=k)
    by_rank = _records(tmp_path / "ddp", "train")[0]["event_index_by_rank"]
    assert len(by_rank) == 2 and not set(by_rank[0]) & set(by_rank[1])
    assert sorted(by_rank[0] + by_rank[1]) == sorted(
        _records(tmp_path / "single", "train")[0]["event_index_by_rank"][0]
    )


def test_records_after_the_checkpoint_and_a_cut_line_are_dropped(tmp_path):
    """What a resume finds after a stopped or killed attempt: steps past its checkpoint and a
    line the kill cut short."""
    from heptstudy.train.out_dir import drop_records_after

    records = [{"kind": "train", "step": s} for s in (1, 2, 3)]
    records.insert(2, {"kind": "validation", "step": 2})
    lines = [json.dumps(r) + "\n" for r in records]
    (tmp_path / "metrics.jsonl").write_text("".join(lines) + '{"kind": "train", "st')
    drop_records_after(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text() == "".join(lines[:3])
