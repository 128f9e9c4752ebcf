"""`heptstudy data generate` and `heptstudy data stats` end to end on a tiny data set."""

from __future__ import annotations

import json

from heptstudy.cli import main


def test_generate_then_stats(tmp_path, capsys):
    d = tmp_path / "tfds"
    rc = main(
        ["data", "generate", "--data-dir", str(d), "--events-train", "4", "--events-test", "2",
         "--seed", "3", "--configs", "1", "2", "--occupancy-scale", "0.03", "--no-progress"]
    )  # fmt: skip
    assert rc == 0
    assert "synthetic" in capsys.readouterr().out
    for name in ("cld_edm_ttbar_hits", "cld_edm_ttbar_pf"):
        for c in ("1", "2"):
            assert (d / name / c / "3.2.1" / "dataset_info.json").is_file()
    out = tmp_path / "stats"
    rc = main(["data", "stats", "--data-dir", str(d), "--split", "train", "--configs", "1", "2",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    stats = json.loads((out / "cld_edm_ttbar_hits_train_stats.json").read_text())
    assert stats["synthetic"] is True and stats["num_events"] == 8
    assert stats["total"]["quantiles"]["p50"] > 0
    assert all(p % 128 == 0 for p in [stats["padded"]["max"]])
    assert (out / "cld_edm_ttbar_hits_train_stats.png").stat().st_size > 1000


def test_stats_error_is_one_clear_line(tmp_path, capsys):
    rc = main(["data", "stats", "--data-dir", str(tmp_path / "missing"), "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "heptstudy data generate" in err
