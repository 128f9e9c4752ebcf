"""User errors of training, training-state files, data, configuration and the backbone bench.

Each row of the table: what the user runs (a `heptstudy` command, in-process, or a library
call), the bad input, fragments the one message must hold (the input, the value, what is
allowed, what to do), and, for every row, that no file in the workspace was lost, changed or
added.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from heptstudy.config import load_config
from heptstudy.errors import HeptstudyError
from heptstudy.train.trainer import train
from tests.conftest import run_cli, set_options, tiny_train_overrides

HITS = "cld_edm_ttbar_hits"
SHARD = f"{HITS}-train.array_record-00000-of-00001"


@pytest.fixture(scope="module")
def finished_run(tiny_data_dir, tmp_path_factory) -> Path:
    """A 4-step run with training-state files at steps 2 and 4."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train(load_config(overrides=tiny_train_overrides(tiny_data_dir, out)), progress=False)
    return out


@pytest.fixture
def ws(tmp_path, finished_run, tiny_data_dir):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    return SimpleNamespace(
        root=tmp_path,
        run=run,
        ckpt=run / "checkpoints" / "step_000002.pt",
        data=tiny_data_dir,
        new=tmp_path / "new",
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _cli(*argv: str) -> str:
    """`heptstudy ARGV` in this process: must fail with exit status 2, no traceback."""
    code, _, text = run_cli(*argv)
    assert code == 2, f"exit status {code}: {text}"
    return text


def _refused(call: Callable[[], object]) -> str:
    with pytest.raises(HeptstudyError) as err:
        call()
    return str(err.value)


def _train_cli(ws, out: Path, *extra: str) -> list[str]:
    return ["train", "--no-progress", *set_options(tiny_train_overrides(ws.data, out)), *extra]


def _resume(ws, path: Path, *overrides: str) -> Callable[[], str]:
    cfg = load_config(overrides=tiny_train_overrides(ws.data, ws.new) + list(overrides))
    return lambda: _refused(lambda: train(cfg, resume=path, progress=False))


def _edited_state(ws, name: str, edit: Callable[[dict], None]) -> Path:
    state = torch.load(ws.ckpt, weights_only=True)
    edit(state)
    path = ws.root / name
    torch.save(state, path)
    return path


# ------------------------------------------------------------------ training output folder


def case_train_into_earlier_run(ws):
    return lambda: _cli(*_train_cli(ws, ws.run))


def case_out_dir_is_a_file(ws):
    (ws.root / "notes.txt").write_text("mine\n")
    return lambda: _cli(*_train_cli(ws, ws.root / "notes.txt"))


def case_out_dir_below_a_file(ws):
    (ws.root / "notes.txt").write_text("mine\n")
    return lambda: _cli(*_train_cli(ws, ws.root / "notes.txt" / "run"))


def case_resume_would_replace_later_steps(ws):
    cfg = load_config(overrides=tiny_train_overrides(ws.data, ws.run))
    return lambda: _refused(lambda: train(cfg, resume=ws.ckpt, progress=False))


# ------------------------------------------------------------------ training-state files


def case_state_bytes_overwritten_with_finite_values(ws):
    state = torch.load(ws.ckpt, weights_only=True)
    name, tensor = max(state["model"].items(), key=lambda kv: kv[1].numel())
    raw = ws.ckpt.read_bytes()
    old = tensor.numpy().tobytes()
    assert raw.count(old) == 1
    bad = ws.root / "overwritten.pt"
    bad.write_bytes(raw.replace(old, (tensor * 0.5 + 0.25).numpy().tobytes()))
    reread = torch.load(bad, weights_only=True)["model"][name]  # torch itself notices nothing
    assert torch.isfinite(reread).all() and not torch.equal(reread, tensor)
    return _resume(ws, bad)


def case_state_without_config(ws):
    return _resume(ws, _edited_state(ws, "no_config.pt", lambda s: s.pop("config")))


def case_state_without_model(ws):
    return _resume(ws, _edited_state(ws, "no_model.pt", lambda s: s.pop("model")))


def case_state_with_a_wrong_part(ws):
    return _resume(ws, _edited_state(ws, "list_model.pt", lambda s: s.update(model=[1, 2])))


def case_state_of_the_unverified_format(ws):
    def old(state):
        state.pop("sha256")
        state["format"] = "heptstudy.checkpoint/1"

    return _resume(ws, _edited_state(ws, "old.pt", old))


def case_state_truncated(ws):
    bad = ws.root / "truncated.pt"
    bad.write_bytes(ws.ckpt.read_bytes()[:5000])
    return _resume(ws, bad)


def case_state_is_a_folder(ws):
    return _resume(ws, ws.run)


def case_state_missing(ws):
    return _resume(ws, ws.root / "nope.pt")


def case_state_of_another_configuration(ws):
    return _resume(ws, ws.ckpt, "model.heptv2.embedding_dim=32")


# ------------------------------------------------------------------ data


def _damaged_copy(ws, damage: Callable[[Path], None]) -> Path:
    data = ws.root / "data"
    shutil.copytree(ws.data / HITS, data / HITS)
    damage(data / HITS / "1" / "3.2.1" / SHARD)
    return data


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1000])  # an interrupted copy: the index is cut


def case_truncated_shard_in_data_stats(ws):
    data = _damaged_copy(ws, _truncate)
    return lambda: _cli("data", "stats", "--data-dir", str(data), "--out", str(ws.new))


def case_truncated_shard_in_training(ws):
    data = _damaged_copy(ws, _truncate)
    cfg = load_config(overrides=tiny_train_overrides(data, ws.new))
    return lambda: _refused(lambda: train(cfg, progress=False))


def case_shard_cut_at_64_kib_in_training(ws):
    # opens as a valid file without records; TFDS would return empty examples
    data = _damaged_copy(ws, lambda p: p.write_bytes(p.read_bytes()[:65536]))
    cfg = load_config(overrides=tiny_train_overrides(data, ws.new))
    return lambda: _refused(lambda: train(cfg, progress=False))


def _overwrite_every_record(path: Path) -> None:
    # a run of bytes every 4 KiB before the index: whichever events training reads first, it
    # meets a damaged one
    raw = bytearray(path.read_bytes())
    for at in range(100, len(raw) // 2, 4096):
        raw[at : at + 64] = b"\x07" * 64
    path.write_bytes(bytes(raw))


def case_damaged_record_in_training(ws):
    data = _damaged_copy(ws, _overwrite_every_record)
    cfg = load_config(overrides=tiny_train_overrides(data, ws.new))
    return lambda: _refused(lambda: train(cfg, progress=False))


def case_missing_shard(ws):
    data = _damaged_copy(ws, Path.unlink)
    cfg = load_config(overrides=tiny_train_overrides(data, ws.new))
    return lambda: _refused(lambda: train(cfg, progress=False))


def case_missing_data_dir(ws):
    cfg = load_config(overrides=tiny_train_overrides(ws.root / "no_data", ws.new))
    return lambda: _refused(lambda: train(cfg, progress=False))


def case_data_dir_of_other_things(ws):
    # a folder of many other things: the message names the data sets there, not all it holds
    for i in range(30):
        (ws.root / f"other_{i}").mkdir()
    cfg = load_config(overrides=tiny_train_overrides(ws.root, ws.new))
    return lambda: _refused(lambda: train(cfg, progress=False))


def case_data_dir_is_the_data_set(ws):
    cfg = load_config(overrides=tiny_train_overrides(ws.data / HITS, ws.new))
    return lambda: _refused(lambda: train(cfg, progress=False))


def case_generate_negative_seed(ws):
    return lambda: _cli(
        "data", "generate", "--data-dir", str(ws.new), "--events-train", "2",
        "--events-test", "2", "--seed", "-1",
    )  # fmt: skip


def case_stats_out_is_a_file(ws):
    (ws.root / "notes.txt").write_text("mine\n")
    return lambda: _cli(
        "data", "stats", "--data-dir", str(ws.data), "--out", str(ws.root / "notes.txt")
    )


def case_generate_below_a_file(ws):
    (ws.root / "notes.txt").write_text("mine\n")
    return lambda: _cli(
        "data", "generate", "--data-dir", str(ws.root / "notes.txt" / "tfds"),
        "--events-train", "2", "--events-test", "2", "--seed", "1",
    )  # fmt: skip


def case_stats_pad_to_zero(ws):
    return lambda: _cli(
        "data", "stats", "--data-dir", str(ws.data), "--pad-to-multiple", "0", "--out", str(ws.new)
    )


# ------------------------------------------------------------------ configuration


def case_block_size_true(ws):
    return lambda: _cli(*_train_cli(ws, ws.new), "--set", "model.heptv2.block_size=true")


def case_config_is_a_folder(ws):
    return lambda: _cli(*_train_cli(ws, ws.new), "--config", str(ws.run))


def case_checkpointing_one(ws):
    return lambda: _cli("config", "show", "--set", "model.heptv2.activation_checkpointing=1")


def case_learning_rate_false(ws):
    return lambda: _cli(*_train_cli(ws, ws.new), "--set", "train.lr=false")


def case_repeated_builder_config(ws):
    return lambda: _cli(*_train_cli(ws, ws.new), "--set", 'data.configs=["1","1"]')


def case_negative_clip_norm(ws):
    return lambda: _cli("config", "show", "--set", "train.lamb.max_grad_norm=-1")


# ------------------------------------------------------------------ backbone bench


def _backbone(*args: str) -> Callable[[], str]:
    tiny = ["model.heptv2.num_convs=1", "model.heptv2.embedding_dim=16", "model.heptv2.num_heads=2"]
    return lambda: _cli("bench", "backbone", *args, *set_options(tiny))


def case_backbone_zero_hits(ws):
    return _backbone("--hits", "0")


def case_backbone_zero_repeats(ws):
    return _backbone("--hits", "64", "--repeats", "0")


def case_backbone_unknown_device(ws):
    return _backbone("--hits", "64", "--device", "gpu")


def case_backbone_zero_threads(ws):
    return _backbone("--hits", "64", "--threads", "0")


def case_backbone_output_is_a_folder(ws):
    return _backbone("--hits", "64", "--output", str(ws.run))


def case_bench_options_before_backbone(ws):
    return lambda: _cli("bench", "--checkpointing", "full", "--dtype", "bfloat16", "backbone")


def case_backbone_empty_output(ws):
    return _backbone("--hits", "64", "--output", "")


def case_bench_empty_output(ws):
    return lambda: _cli("bench", "--batch-size", "1", "--output", "")


def case_bench_checkpointing_before_paired(ws):
    return lambda: _cli("bench", "--checkpointing", "full", "paired", "keep25")


def case_parity_only_after_paired(ws):
    return lambda: _cli("bench", "paired", "full", "--parity-only")


CASES = [
    (case_train_into_earlier_run, ["train.out_dir=", "/run'", "already holds an earlier run",
                                   "--resume", "step_000004.pt", "--new-run", "run-002"]),
    (case_out_dir_is_a_file, ["notes.txt", "is a file, not a folder", "set train.out_dir"]),
    (case_out_dir_below_a_file, ["notes.txt", "cannot be created", "is a file",
                                "choose another train.out_dir"]),
    (case_resume_would_replace_later_steps, ["resuming step 2", "checkpoints/step_000004.pt",
                                             "predictions/step_000004.npz", "--new-run"]),
    (case_state_bytes_overwritten_with_finite_values, ["overwritten.pt", "sha256 checksum",
                                                       "another checkpoint"]),
    (case_state_without_config, ["no_config.pt", "lacks 'config'", "resume from another"]),
    (case_state_without_model, ["no_model.pt", "lacks 'model'", "resume from another"]),
    (case_state_with_a_wrong_part, ["list_model.pt", "'model' is a list", "mappings"]),
    (case_state_of_the_unverified_format, ["old.pt", "'heptstudy.checkpoint/1'",
                                           "cannot be verified", "--new-run"]),
    (case_state_truncated, ["truncated.pt", "not a readable training-state file", "truncated"]),
    (case_state_missing, ["nope.pt", "no such file", "step_NNNNNN.pt"]),
    (case_state_is_a_folder, ["/run'", "is a folder", "step_000004.pt"]),
    (case_state_of_another_configuration, ["other settings than this run's",
                                           "model.heptv2.embedding_dim: checkpoint 16, now 32",
                                           "--new-run"]),
    (case_truncated_shard_in_data_stats, [SHARD, "truncated", "heptstudy data generate"]),
    (case_truncated_shard_in_training, [SHARD, "truncated", "copy it again"]),
    (case_shard_cut_at_64_kib_in_training, [SHARD, "holds 0 events", "lists 24", "truncated"]),
    (case_damaged_record_in_training, [SHARD, "cannot be read at its record",
                                       "truncated, damaged or missing", "copy the file again"]),
    (case_missing_shard, [SHARD, "lacks 1 of its 1 ArrayRecord files", "copy it again"]),
    (case_missing_data_dir, ["no_data", "does not exist", "heptstudy data generate"]),
    (case_data_dir_of_other_things, ["not found in data directory", "TFDS data sets there: none",
                                     "heptstudy data generate"]),
    (case_data_dir_is_the_data_set, [f"/{HITS}'", "give the folder above it",
                                     "as the data directory"]),
    (case_generate_negative_seed, ["--seed", "-1 is below 0", "at least 0"]),
    (case_stats_out_is_a_file, ["--out", "notes.txt", "is a file", "Give --out a folder"]),
    (case_generate_below_a_file, ["--data-dir", "notes.txt", "is a file", "nothing was generated"]),
    (case_stats_pad_to_zero, ["--pad-to-multiple", "0 is below 1"]),
    (case_block_size_true, ["model.heptv2.block_size=true", "whole number, not true/false",
                            "default 100"]),
    (case_config_is_a_folder, ["configuration file", "/run'", "is a folder", "YAML file"]),
    (case_checkpointing_one, ["model.heptv2.activation_checkpointing=1", "allowed values are off, full",
                              "a number is not a checkpointing plan"]),
    (case_learning_rate_false, ["train.lr=false", "a number, not true/false", "default 0.001"]),
    (case_repeated_builder_config, ["data.configs=['1', '1']", "more than once"]),
    (case_negative_clip_norm, ["train.lamb.max_grad_norm", "greater than or equal to 0", "-1"]),
    (case_backbone_zero_hits, ["--hits 0", "at least 1", "--hits 10000"]),
    (case_backbone_zero_repeats, ["--repeats 0", "at least 1"]),
    (case_backbone_unknown_device, ["--device 'gpu'", "cpu, cuda or cuda:N"]),
    (case_backbone_zero_threads, ["--threads 0", "at least 1"]),
    (case_backbone_output_is_a_folder, ["/run'", "is a directory", "NAME.json"]),
    (case_bench_options_before_backbone, ["bench backbone: --checkpointing, --dtype do not apply",
                                          "--set model.heptv2.activation_checkpointing=true"]),
    (case_backbone_empty_output, ["--output", "'' is empty", "leave --output out"]),
    (case_bench_empty_output, ["--output", "'' is empty", "leave --output out"]),
    (case_bench_checkpointing_before_paired, ["bench paired: --checkpointing does not apply",
                                              "leave it out"]),
    (case_parity_only_after_paired, ["bench paired: --parity-only does not apply"]),
]  # fmt: skip


@pytest.mark.parametrize(
    "case,fragments", [pytest.param(c, f, id=c.__name__.removeprefix("case_")) for c, f in CASES]
)
def test_user_error_is_one_clear_message_and_changes_no_file(ws, case, fragments):
    act = case(ws)
    before = _snapshot(ws.root)
    message = act()
    missing = [f for f in fragments if f not in message]
    assert not missing, f"{missing} not in: {message}"
    assert _snapshot(ws.root) == before  # nothing lost, changed or added
    assert not ws.new.exists()
