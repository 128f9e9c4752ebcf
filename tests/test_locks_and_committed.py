"""Issue 34, cases 1 and 2: a lock is never written through a link or over a file that is not
a lock, and committed results are what git tracks in the repository that holds the target,
whichever checkout the package runs from."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heptstudy.locks import LOCK_NAME, NotALock, holding
from tests.conftest import run_cli, set_options, tiny_train_overrides

ROOT = Path(__file__).resolve().parents[1]
#: a committed file as the decoy a lock link points at: that it stays byte for byte the same is
#: what is tested, not what it says
COMMITTED_REPORT = ROOT / "experiments" / "cpu_reference" / "baseline_b1.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("inside_repository", [False, True])
def test_train_refuses_a_lock_that_is_a_link_and_leaves_its_target_alone(
    tmp_path, tiny_data_dir, inside_repository
):
    if inside_repository:
        decoy = COMMITTED_REPORT
    else:
        decoy = tmp_path / "decoy.json"
        decoy.write_text('{"a committed": "report"}\n')
    before = _digest(decoy)
    out = tmp_path / "t_x"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(decoy)
    code, _, err = run_cli(
        "train", "--no-progress", *set_options(tiny_train_overrides(tiny_data_dir, out))
    )
    assert code == 2
    assert "is a symbolic link" in err and "neither followed nor replaced" in err
    assert "Move it out of the folder" in err
    assert _digest(decoy) == before
    assert (out / LOCK_NAME).is_symlink()
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing trained


@pytest.mark.parametrize("kind", ["folder", "hard link", "other content"])
def test_a_lock_path_holding_something_else_is_refused_and_kept(tmp_path, kind):
    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / LOCK_NAME
    decoy = tmp_path / "decoy.txt"
    if kind == "folder":
        lock.mkdir()
        (lock / "inside").write_text("kept")
    elif kind == "hard link":
        decoy.write_text("precious\n")
        os.link(decoy, lock)
    else:
        lock.write_text("precious, not a lock\n")
    with pytest.raises(NotALock) as err, holding(folder, "study run --out"):
        pytest.fail("the block must not run")
    text = str(err.value)
    assert "not a heptstudy lock file" in text and "precious" not in text
    assert "Free space" not in text
    if kind == "folder":
        assert "is a folder" in text and (lock / "inside").read_text() == "kept"
    elif kind == "hard link":
        assert "hard link" in text and decoy.read_text() == "precious\n"
    else:
        assert "holds other content" in text and lock.read_text() == "precious, not a lock\n"


def test_an_empty_lock_file_left_by_a_crash_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).write_text("")
    with holding(folder, "train.out_dir") as lock:
        assert '"pid"' in lock.read_text()
    assert not (folder / LOCK_NAME).exists()


@pytest.fixture(scope="module")
def second_clone(tmp_path_factory):
    """A second clone of this repository (its committed history), used with this checkout's
    environment: the package imported is this checkout's, the files are the clone's."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    clone = tmp_path_factory.mktemp("second") / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
        check=True,
        capture_output=True,
    )
    return clone


def _clone_status(clone: Path) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_aggregate_in_a_second_clone_refuses_that_clones_committed_results(second_clone):
    before = _clone_status(second_clone)
    code = subprocess.run(
        [
            # the console script of this checkout's environment (an editable install of it):
            # `python -m` would import the clone's own package from the working directory
            str(Path(sys.executable).parent / "heptstudy"),
            "study",
            "aggregate",
            "--out",
            "experiments/cpu_reference",
            "--figures",
            "figures/cpu_reference",
        ],
        cwd=second_clone,
        capture_output=True,
        text=True,
        check=False,
    )
    assert code.returncode == 2, code.stderr
    assert "Traceback" not in code.stderr
    assert "committed reference folder (cpu_reference)" in code.stderr
    assert f"in the repository {second_clone.resolve()}" in code.stderr
    assert _clone_status(second_clone) == before  # nothing written, nothing left


def test_committed_place_is_found_from_the_path_not_the_package(second_clone, tmp_path):
    from heptstudy.committed import committed_place

    place = committed_place(second_clone / "figures" / "cpu_reference" / "new.png")
    assert place is not None and place.reference and place.name == "cpu_reference"
    assert place.repository == second_clone.resolve()
    readme = committed_place(second_clone / "README.md")
    assert readme is not None and not readme.reference and readme.name == "README.md"
    assert committed_place(second_clone / "experiments" / "local" / "mine") is None
    assert (
        committed_place(second_clone / "experiments" / "cpu_reference" / ".pending" / "a.json")
        is None
    )
    assert committed_place(tmp_path / "experiments" / "cpu_reference") is None  # no repository
