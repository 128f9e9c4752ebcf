"""Issue 34: nothing trusted that a file or a user's text says (cases 3, 4, 5, 9, 10, 12)."""

from __future__ import annotations

import pandas as pd
import pytest
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from heptstudy import study

LINKS = [
    "[click](javascript:alert(2))",
    "![x](javascript:alert(3))",
    "[ref][1]\n\n[1]: javascript:alert(4)",
    "<javascript:alert(5)>",
]


ROW = {
    "name": "r",
    "kind": "memory",
    "status": "ok",
    "device": "cpu",
    "device_kind": "cpu",
    "dtype": "float32",
    "threads": 2,
    "torch": "2.13",
    "dataset": "ds",
    "data_dir": "/d",
    "synthetic": True,
    "counted_steps": 1,
    "warmup_steps": 1,
    "host": "h",
    "allocator": "glibc",
    "allocator_line": "platform",
    "round": 1,
    "load_average_1min": 0.5,
    "platform": "p",
}


@pytest.mark.parametrize("description", LINKS)
def test_a_markdown_link_in_a_description_never_becomes_a_link(description):
    df = pd.DataFrame([ROW])
    markdown = study.study_statement(df, description, [description])
    page = markdown2html_mistune(markdown)  # what nbconvert makes of the report's Markdown
    assert "<a " not in page and "<img" not in page and "href" not in page
    assert "javascript:alert" in page  # shown as text, not dropped


def test_a_project_link_still_renders():
    # the escaping is of user text only: Markdown the report writes itself keeps working
    page = markdown2html_mistune(study.esc("a(b)") + " [report](report.html)")
    assert '<a href="report.html">' in page and "a(b)" in page.replace("&#40;", "(").replace(
        "&#41;", ")"
    )


@pytest.mark.parametrize("step", [-5, 0, 10_000])
def test_a_training_state_with_an_impossible_step_is_refused(tiny_data_dir, tmp_path, step):
    import torch

    from heptstudy.config import load_config
    from heptstudy.train.state import PARTS, state_digest
    from heptstudy.train.trainer import train
    from tests.conftest import run_cli, set_options, tiny_train_overrides

    first = tmp_path / "first"
    train(
        load_config(overrides=tiny_train_overrides(tiny_data_dir, first, num_steps=2)),
        progress=False,
    )
    state = torch.load(first / "checkpoints" / "step_000002.pt", weights_only=True)
    state["step"] = step
    state["sha256"] = state_digest({k: state[k] for k in PARTS})  # a valid digest
    edited = tmp_path / "edited.pt"
    torch.save(state, edited)
    out = tmp_path / "resumed"
    code, _, err = run_cli(
        "train",
        "--no-progress",
        "--resume",
        str(edited),
        *set_options(tiny_train_overrides(tiny_data_dir, out, num_steps=2)),
    )
    assert code == 2
    assert f"its 'step' is {step}" in err and "step 1 to 2 (train.num_steps)" in err
    assert "nothing was written" in err
    assert not out.exists() or not any(out.rglob("step_*.pt"))


@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "model.heptv2.auto_plan_order=[layers99]",
            "layers99 checkpoints 99 of the backbone's 3 layers",
        ),
        (
            "model.heptv2.auto_plan_order=[last4,full]",
            "last4 checkpoints 4 of the backbone's 3 layers",
        ),
        ("model.heptv2.memory_budget_gib=inf", "model.heptv2.memory_budget_gib"),
        ("model.heptv2.memory_budget_gib=nan", "model.heptv2.memory_budget_gib"),
    ],
)
def test_a_plan_or_budget_that_cannot_be_is_refused(override, said):
    from tests.conftest import TINY_MODEL, run_cli, set_options

    code, out, err = run_cli("config", "show", *set_options([*TINY_MODEL, override]))
    assert code == 2 and said in err, err
    assert "Infinity" not in out and "NaN" not in out


SECRET_FILES = {
    "shadow": "root:$6$SECRETHASH:19000:0:99999:7:::\nbob:$6$OTHERSECRET:19000\n",
    "mapping": "user: alice\npassword: SECRETPW\n",
    "env": "PATH=/SECRET/bin\nHOME=/root/SECRETHOME\n",
    "binary": b"\xff\xfeSECRET\x00",
}


@pytest.mark.parametrize("kind", sorted(SECRET_FILES))
def test_a_platform_that_is_some_other_file_is_refused_without_showing_it(tmp_path, kind):
    from tests.conftest import run_cli

    path = tmp_path / kind
    content = SECRET_FILES[kind]
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out, err = run_cli("fit", "--platform", str(path), "--per-device-batch", "4")
    assert code == 2 and str(path) in err
    assert "SECRET" not in err + out and "alice" not in err + out


@pytest.mark.parametrize(
    ("code", "advice"),
    [
        ("ENOSPC", "Free space (or raise the quota)"),
        ("EROFS", "read-only"),
        ("EACCES", "permissions"),
        ("EISDIR", "A folder stands where a file is to be written"),
        ("ENOTDIR", "A file stands where a folder is needed"),
        ("ELOOP", "loop of symbolic links"),
    ],
)
def test_the_advice_after_a_refused_write_follows_the_error(tmp_path, code, advice):
    import errno
    import os

    from heptstudy.atomic import WriteFailed, write_text_or_keep
    from tests.conftest import failing_writes

    number = getattr(errno, code)
    with failing_writes(OSError(number, os.strerror(number))), pytest.raises(WriteFailed) as err:
        write_text_or_keep(tmp_path / "report.json", "{}", "the report")
    text = str(err.value)
    assert advice in text
    assert code == "ENOSPC" or "Free space" not in text


def test_a_first_checkpoint_that_could_not_be_written_advises_a_rerun_that_is_accepted(
    tmp_path, tiny_data_dir
):
    import errno
    import os

    from heptstudy.atomic import WriteFailed
    from heptstudy.config import load_config
    from heptstudy.train.trainer import train
    from tests.conftest import failing_writes, tiny_train_overrides

    out = tmp_path / "run"
    cfg = load_config(overrides=tiny_train_overrides(tiny_data_dir, out))
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with (
        failing_writes(full, lambda p: p.endswith("step_000002.pt")),
        pytest.raises(WriteFailed) as err,
    ):
        train(cfg, progress=False)
    assert "Free space" in str(err.value) and "--new-run" in str(err.value)
    summary = train(cfg, new_run=True, progress=False)  # what the advice says is accepted
    assert summary["step"] == 4


def test_a_train_split_of_events_without_hits_is_refused(tiny_data_dir, tmp_path):
    import shutil

    from array_record.python.array_record_module import ArrayRecordWriter

    from heptstudy.data.tfds import FEATURE_KEYS, HITS_NAME, features_dict, open_dataset
    from tests.conftest import run_cli, set_options, tiny_train_overrides

    data = tmp_path / "data"
    shutil.copytree(tiny_data_dir, data)
    train = open_dataset(data, f"{HITS_NAME}:3.2.1", ["1"], "train")
    (path,) = data.rglob(f"{HITS_NAME}-train.array_record-*")  # TFDS's name of its one shard
    events = [{k: train[i][k] for k in FEATURE_KEYS} for i in range(len(train))]
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for ev in events:  # the same events, their hits taken out
        for k in ("X", "ytarget", "ycand"):
            ev[k] = ev[k][:0]
        writer.write(features_dict(HITS_NAME).serialize_example(ev))
    writer.close()
    out = tmp_path / "run"
    code, _, err = run_cli("train", "--no-progress", *set_options(tiny_train_overrides(data, out)))
    assert code == 2
    assert f"{HITS_NAME} configs ['1'] train split: every event of the batch" in err
    assert "has 0 hits" in err and str(path.parent) in err and "heptstudy data generate" in err
    assert not any(out.rglob("step_*.pt"))


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("allocated.fixed_mib", -50000, "allocated.fixed_mib=-50000 is not allowed"),
        ("allocated.per_padded_hit_mib", float("nan"), "allocated.per_padded_hit_mib=nan"),
        ("reserved.ratio", 0.5, "reserved.ratio=0.5 is not allowed (a finite number >= 1"),
        ("allocated_points.0.batch_size", 0, "allocated_points[0].batch_size=0"),
    ],
)
def test_a_stored_memory_model_with_an_impossible_number_is_not_used(tmp_path, field, value, said):
    import json

    from heptstudy import fingerprint
    from heptstudy.estimate.memory_model import MemoryModel
    from heptstudy.fitting.select import choose_model
    from heptstudy.paths import ROOT

    fits = tmp_path / "fits"
    fits.mkdir()
    path = fits / "h100_hit_heptv2_b48_estimated.json"
    model = MemoryModel.load(ROOT / "configs" / "fit" / path.name)
    model.fingerprint = fingerprint.make(model.source, model.key)  # as if made from this code
    model.save(path)
    assert choose_model(model.key, (), fits).model is not None
    data = json.loads(path.read_text())
    *parents, last = field.split(".")
    node = data
    for part in parents:
        node = node[int(part) if part.isdigit() else part]
    node[last] = value
    path.write_text(json.dumps(data))
    choice = choose_model(model.key, (), fits)
    assert choice.model is None
    (why,) = [r.reason for r in choice.not_used]
    assert (
        str(path) in why and said in why and "regenerate it with scripts/regenerate_fits.sh" in why
    )


H100 = "configs/training/platforms/h100.yaml"


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            '# PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True"',
            'PYTORCH_CUDA_ALLOC_CONF: "expandable_segmentz:True"',
            "env.PYTORCH_CUDA_ALLOC_CONF='expandable_segmentz:True': option 'expandable_segmentz' "
            "is unknown to PyTorch's caching allocator; did you mean 'expandable_segments'? "
            "(known: backend, max_split_size_mb,",
        ),
        (
            '# PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True"',
            'PYTORCH_CUDA_ALLOC_CONF: "max_split_size_mb:512,garbage_collection_threshold:2"',
            "garbage_collection_threshold:2 is not allowed: garbage_collection_threshold must be "
            "a number between 0 and 1 (both excluded)",
        ),
        (
            'torch_version: "2.11"',
            'torch_version: "99.99"',
            "torch_version='99.99': no CUDA autocast table for PyTorch '99.99'; known: 2.11, "
            "2.12, 2.13",
        ),
    ],
)
def test_a_platform_value_the_estimate_does_not_know_is_refused(tmp_path, old, new, said):
    from heptstudy.paths import ROOT
    from tests.conftest import run_cli

    text = (ROOT / H100).read_text()
    assert old in text
    path = tmp_path / "h100.yaml"
    path.write_text(text.replace(old, new))
    code, out, err = run_cli("fit", "--platform", str(path), "--per-device-batch", "48")
    assert code == 2 and str(path) in err and said in err, err
    assert out == ""


def test_allocator_settings_pytorch_accepts_are_accepted(tmp_path):
    from heptstudy.config import load_platform
    from heptstudy.paths import ROOT

    conf = "roundup_power2_divisions:[256:1,512:2,>:4], expandable_segments:True,backend:native"
    path = tmp_path / "h100.yaml"
    path.write_text(
        (ROOT / H100)
        .read_text()
        .replace(
            '# PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True"',
            f'PYTORCH_CUDA_ALLOC_CONF: "{conf}"',
        )
    )
    assert load_platform(path).env["PYTORCH_CUDA_ALLOC_CONF"] == conf


def test_a_test_split_size_the_files_do_not_hold_is_refused(tiny_data_dir, tmp_path):
    import json
    import shutil

    from tests.conftest import run_cli

    data = tmp_path / "data"
    shutil.copytree(tiny_data_dir, data)
    info = data / "cld_edm_ttbar_hits" / "1" / "3.2.1" / "dataset_info.json"
    meta = json.loads(info.read_text())
    (test,) = [s for s in meta["splits"] if s["name"] == "test"]
    test["shardLengths"] = ["100000"]  # 16 events are there
    info.write_text(json.dumps(meta))
    args = ["--scenario", "cld_pf_default", "--platform", "local_cpu", "--data-dir", str(data)]
    args += ["--set", "data.nvalid=4", "--set", "data.ntest=4"]
    code, out, err = run_cli("scenario", "resolve", *args)
    assert code == 2 and out == ""
    assert "cld_edm_ttbar_hits-test.array_record-00000-of-00001' holds 16 events" in err
    assert f"but {str(info)!r} lists 100000 for it (shardLengths of split 'test')" in err
    assert "heptstudy data generate" in err
