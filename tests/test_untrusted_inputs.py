"""Issue 34: nothing trusted that a file or a user's text says (cases 3, 4, 9, 12)."""

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
    from tests.conftest import tiny_train_overrides
    from tests.test_reliability import _cli, _set

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
    code, _, err = _cli(
        "train",
        "--no-progress",
        "--resume",
        str(edited),
        *_set(tiny_train_overrides(tiny_data_dir, out)),
    )
    assert code == 2
    assert f"its 'step' is {step}" in err and "step 1 to 4 (train.num_steps)" in err
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
    from tests.conftest import TINY_MODEL
    from tests.test_reliability import _cli, _set

    code, out, err = _cli("config", "show", *_set([*TINY_MODEL, override]))
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
    from tests.test_reliability import _cli

    path = tmp_path / kind
    content = SECRET_FILES[kind]
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out, err = _cli("fit", "--platform", str(path), "--per-device-batch", "4")
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
    from heptstudy.stand_ins import failing_writes

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
    from heptstudy.stand_ins import failing_writes
    from heptstudy.train.trainer import train
    from tests.conftest import tiny_train_overrides

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
