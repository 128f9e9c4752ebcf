"""`heptstudy data generate` and `heptstudy data stats` refuse bad input up front: one message
naming the option and value, nothing generated or written, no earlier file replaced."""

from __future__ import annotations

import pytest

from heptstudy.data.generate import generate_datasets
from heptstudy.data.tfds import HITS_NAME, open_dataset
from heptstudy.errors import DataError
from tests.conftest import generate_tiny_data, run_cli

STATS_JSON = f"{HITS_NAME}_train_stats.json"


@pytest.fixture(scope="module")
def two_events(tmp_path_factory):
    """2 train + 2 test events of builder config 1 (a few seconds)."""
    return generate_tiny_data(tmp_path_factory.mktemp("tfds"), 2, 2, seed=1)


def _stats(data_dir, out, *more):
    return run_cli("data", "stats", "--data-dir", str(data_dir), "--out", str(out), *more)


def test_stats_refuses_a_repeated_config_and_keeps_earlier_statistics(two_events, tmp_path):
    out = tmp_path / "stats"
    code, _, err = _stats(two_events, out, "--configs", "1")
    assert code == 0, err
    before = (out / STATS_JSON).read_bytes()
    code, _, err = _stats(two_events, out, "--configs", "1", "1")
    # counted twice before (num_events 4 of 2) and written over the earlier file
    assert code == 2
    assert "--configs 1 1" in err and "'1' more than once" in err and "--configs 1\n" in err
    assert "data.configs" not in err
    assert (out / STATS_JSON).read_bytes() == before


def test_stats_refuses_a_repeated_config_before_creating_out(two_events, tmp_path):
    out = tmp_path / "new"
    code, _, err = _stats(two_events, out, "--configs", "1", "2", "1")
    assert code == 2 and "--configs 1 2 1" in err and "'1' more than once" in err
    assert not out.exists()


def test_generate_refuses_a_repeated_config_before_generating(tmp_path):
    data_dir = tmp_path / "tfds"
    code, _, err = run_cli(
        "data", "generate", "--events-train", "2", "--events-test", "2", "--seed", "1",
        "--configs", "1", "1", "--data-dir", str(data_dir), "--occupancy-scale", "0.03",
        "--no-progress",
    )  # fmt: skip
    # before: every event simulated, then "No such file or directory (.../incomplete.3.2.1)"
    assert code == 2
    assert "--configs 1 1" in err and "'1' more than once" in err
    assert "No such file" not in err
    assert not data_dir.exists()


def test_generate_datasets_refuses_a_repeated_config(tmp_path):
    with pytest.raises(DataError, match=r"--configs 2 1 2 names builder config '2' more than"):
        generate_datasets(tmp_path / "tfds", 1, 1, seed=1, configs=("2", "1", "2"))
    assert not (tmp_path / "tfds").exists()


def test_stats_data_dir_that_is_a_file(tmp_path):
    data_file, out = tmp_path / "data.txt", tmp_path / "stats"
    data_file.write_text("not a data set\n")
    code, _, err = _stats(data_file, out)
    assert code == 2
    assert f"{str(data_file)!r} is a file, not a folder" in err and "--data-dir" in err
    assert "does not exist" not in err and "data.data_dir" not in err
    assert data_file.read_text() == "not a data set\n" and not out.exists()


def test_reader_data_dir_that_is_a_file_names_the_option_and_the_config_key(tmp_path):
    data_file = tmp_path / "data.txt"
    data_file.write_text("")
    with pytest.raises(
        DataError, match=r"is a file, not a folder; give --data-dir \(or data.data_dir"
    ):
        open_dataset(data_file, f"{HITS_NAME}:3.2.1", ["1"], "train")


@pytest.mark.parametrize(
    ("options", "named", "key"),
    [
        (["--dataset", "cld_hits"], "--dataset 'cld_hits' is not of the form", "data.dataset"),
        (["--dataset", f"{HITS_NAME}:9.9.9"], "set --dataset to", "data.dataset"),
        (["--configs", "2"], "set --configs to", "data.configs"),
        (["--configs", "1", "3"], "builder config '3'", "data.configs"),
    ],
)
def test_stats_messages_name_the_options(two_events, tmp_path, options, named, key):
    out = tmp_path / "stats"
    code, _, err = _stats(two_events, out, *options)
    assert code == 2 and named in err and key not in err, err
    assert not out.exists()
