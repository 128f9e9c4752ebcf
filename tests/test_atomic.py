"""Atomic writes: a failed write keeps the previous file and leaves no temporary file behind."""

import os
import stat

import pytest

from heptstudy.atomic import atomic_open, atomic_path, atomic_savefig, atomic_write_text

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Boom(Exception):
    pass


def _leftovers(folder, keep):
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_write_text_replaces_content_and_creates_folders(tmp_path):
    target = tmp_path / "a" / "b" / "report.json"
    assert atomic_write_text(target, "first\n") == target
    atomic_write_text(target, "second\n")
    assert target.read_text() == "second\n"
    assert _leftovers(target.parent, {"report.json"}) == []


def test_failure_midway_keeps_previous_content(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("previous\n")
    with pytest.raises(Boom), atomic_open(target, "w") as fh:
        fh.write("half of the new con")
        fh.flush()
        raise Boom
    assert target.read_text() == "previous\n"
    assert _leftovers(tmp_path, {"report.json"}) == []


def test_keyboard_interrupt_also_cleans_up(tmp_path):
    target = tmp_path / "model.pt"
    with pytest.raises(KeyboardInterrupt), atomic_open(target, "wb") as fh:
        fh.write(b"partial")
        raise KeyboardInterrupt
    assert not target.exists()
    assert _leftovers(tmp_path, set()) == []


def test_failed_writer_on_a_path_keeps_previous_file(tmp_path):
    target = tmp_path / "table.csv"
    target.write_text("a,b\n1,2\n")
    with pytest.raises(Boom), atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_text("a,b\n")
        raise Boom
    assert target.read_text() == "a,b\n1,2\n"
    assert _leftovers(tmp_path, {"table.csv"}) == []


def test_append_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'w'"), atomic_open(tmp_path / "log.txt", "a"):
        pass


def test_new_file_gets_the_mode_open_would_give(tmp_path):
    mask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "new.yaml", "x: 1\n")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.yaml").stat().st_mode) == 0o644


def test_replacing_keeps_the_existing_mode(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n")
    script.chmod(0o755)
    atomic_write_text(script, "#!/bin/bash\ntrue\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


def test_savefig_writes_a_readable_png_and_pdf(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    png = atomic_savefig(fig, tmp_path / "figs" / "line.png", dpi=50)
    pdf = atomic_savefig(fig, tmp_path / "figs" / "line.pdf")
    plt.close(fig)
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert pdf.read_bytes().startswith(b"%PDF")
    assert _leftovers(tmp_path / "figs", {"line.png", "line.pdf"}) == []


def test_savefig_failure_keeps_previous_figure(tmp_path):
    class BrokenFigure:
        def savefig(self, fname, **kwargs):
            with open(fname, "wb") as fh:
                fh.write(PNG_MAGIC[:4])
            raise Boom

    target = tmp_path / "line.png"
    target.write_bytes(b"old figure by Matplotlib")
    with pytest.raises(Boom):
        atomic_savefig(BrokenFigure(), target)
    assert target.read_bytes() == b"old figure by Matplotlib"
    assert _leftovers(tmp_path, {"line.png"}) == []
