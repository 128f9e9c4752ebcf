"""No file destroyed by a name or a kill, no data set broken by a race (issue 44): one test per
mechanism, each by behaviour.

* every user-named output replaces only its own kind of file;
* papermill's executed notebooks appear whole or not at all;
* one lock per folder a command writes into, data directories included;
* a data set is checked against its folder and files on open, and empty events are named;
* sizes that cannot fit are refused before anything is allocated;
* Ctrl-C ends a command with one line, no traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from heptstudy.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------ outputs


@pytest.mark.parametrize(
    "name,content,fragments",
    [
        ("README.md", "# my notes\n", ["written to a .json file", "README.json"]),
        ("notes.json", '{"mine": 1}\n', ["is not a heptstudy bench report", "To keep it"]),
    ],
    ids=["not-json", "foreign-json"],
)
def test_bench_output_never_replaces_a_file_that_is_not_a_report(
    name, content, fragments, tmp_path, capsys
):
    target = tmp_path / name
    target.write_text(content)
    code, _, err = _cli(capsys, "bench", "--batch-size", "1", "--output", target)
    assert code == 2
    assert all(f in err for f in fragments), err
    assert target.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_report_replaces_a_report_and_nothing_else(tmp_path):
    from heptstudy.atomic import NotOurs
    from heptstudy.measure import report as rp

    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"other": "tool"}\n')
    text = rp.REPORT_FILE.mark.decode() + "\n"
    own = tmp_path / "own.json"
    own.write_text("{" + text + "}")
    assert rp.REPORT_FILE.check(own) is True
    with pytest.raises(NotOurs, match="is not a heptstudy bench report"):
        rp.REPORT_FILE.check(foreign)
    assert foreign.read_text() == '{"other": "tool"}\n'
    assert rp.REPORT_FILE.check(tmp_path / "absent.json") is False


def test_a_figure_replaces_a_figure_and_nothing_else(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from heptstudy.atomic import NotOurs, atomic_savefig

    fig, _ = plt.subplots()
    photo = tmp_path / "photo.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(NotOurs, match="not a matplotlib png figure"):
        atomic_savefig(fig, photo)
    assert photo.read_bytes() == b"\x89PNG\r\n\x1a\n" + b"\0" * 100
    for suffix in ("png", "pdf"):
        atomic_savefig(fig, tmp_path / f"f.{suffix}")
        atomic_savefig(fig, tmp_path / f"f.{suffix}")  # its own: replaced
    plt.close(fig)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_data_stats_writes_under_the_working_directory_and_keeps_foreign_files(
    tiny_data_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = ("data", "stats", "--data-dir", tiny_data_dir)
    code, out, err = _cli(capsys, *argv)
    assert code == 0, err
    folder = tmp_path / "experiments" / "scratch" / "data_stats"
    js = folder / "cld_edm_ttbar_hits_train_stats.json"
    assert js.is_file() and js.with_suffix(".png").is_file()
    code, out, err = _cli(capsys, *argv)
    assert code == 0 and "replace the statistics" in out, err
    js.write_text('{"someone": "else"}\n')
    png_before = js.with_suffix(".png").read_bytes()
    code, _, err = _cli(capsys, *argv)
    assert code == 2 and "is not a heptstudy data statistics file" in err
    assert js.read_text() == '{"someone": "else"}\n'
    assert js.with_suffix(".png").read_bytes() == png_before
