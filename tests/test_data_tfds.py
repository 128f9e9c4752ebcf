"""Writing and reading the TFDS data sets: round trip, target convention, independent writer,
errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from heptstudy.data.generate import generate_datasets
from heptstudy.data.generate.event import simulate_event
from heptstudy.data.generate.writer import _event_rng
from heptstudy.data.tfds import (
    HIT_FEATURES,
    HITS_NAME,
    PF_FEATURES,
    PF_NAME,
    TARGET_COLUMNS,
    open_dataset,
)
from heptstudy.errors import DataError

SEED, OCC = 7, 0.03
N_TRAIN, N_TEST = 6, 4
KEYS = ("X", "ytarget", "ycand", "genmet", "genjets", "targetjets")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfds")
    generate_datasets(
        d, N_TRAIN, N_TEST, seed=SEED, configs=("1",), occupancy_scale=OCC, progress=False
    )
    return d


@pytest.mark.parametrize("name,key", [(HITS_NAME, "hits"), (PF_NAME, "pf")])
@pytest.mark.parametrize("split", ["train", "test"])
def test_round_trip_field_by_field(tiny, name, key, split):
    ds = open_dataset(tiny, f"{name}:3.2.1", ["1"], split)
    assert len(ds) == (N_TRAIN if split == "train" else N_TEST)
    assert ds.shard_sizes == [len(ds)]
    for i in range(len(ds)):
        want = simulate_event(_event_rng(SEED, "1", split, i), OCC)[key]
        got = ds[i]
        assert int(got["event_index"]) == i
        for k in KEYS:
            assert got[k].dtype == np.float32, k
            np.testing.assert_array_equal(got[k], np.asarray(want[k], dtype=np.float32), err_msg=k)
        width = len(HIT_FEATURES) if key == "hits" else len(PF_FEATURES)
        assert got["X"].shape[1] == width and got["ytarget"].shape[1] == len(TARGET_COLUMNS)
        assert not got["ycand"].any()


def test_metadata_says_synthetic(tiny):
    for name in (HITS_NAME, PF_NAME):
        md = open_dataset(tiny, f"{name}:3.2.1", ["1"], "train").metadata
        assert md["synthetic"] is True
        assert md["seed"] == SEED and md["occupancy_scale"] == OCC
        assert "jets" in md


def _check_target_convention(X, y):
    pn = y[:, 13].astype(int)
    rep = y[:, 0] != 0
    # hits of no particle are all zeros
    assert not y[pn == 0].any()
    # representative rows: PDG class 1..5, unique particle numbers
    assert set(np.unique(y[rep, 0]).astype(int)) <= {1, 2, 3, 4, 5}
    numbers = pn[rep]
    assert len(np.unique(numbers)) == len(numbers)
    assert np.all(numbers > 0)
    # every particle number has exactly one representative row
    assert set(np.unique(pn[pn > 0])) == set(numbers)
    # other rows carry only particle_number
    others = ~rep & (pn > 0)
    assert not y[others][:, :13].any()
    # representative rows carry the properties
    r = y[rep]
    assert np.all(r[:, 6] > 0) and np.all(r[:, 2] > 0)
    np.testing.assert_allclose(r[:, 4] ** 2 + r[:, 5] ** 2, 1.0, rtol=1e-5)
    return numbers


def test_target_convention_every_event(tiny):
    for name in (HITS_NAME, PF_NAME):
        for split in ("train", "test"):
            ds = open_dataset(tiny, f"{name}:3.2.1", ["1"], split)
            for i in range(len(ds)):
                ev = ds[i]
                numbers = _check_target_convention(ev["X"], ev["ytarget"])
                if name == HITS_NAME:
                    # particles numbered 1..P; tracker hits first
                    assert sorted(numbers) == list(range(1, len(numbers) + 1))
                    et = ev["X"][:, 0]
                    assert set(np.unique(et)) <= {1.0, 2.0}
                    assert np.all(np.diff(et) >= 0)
                    # charged particles with tracker hits: representative is a tracker hit
                    rep = ev["ytarget"][:, 0] != 0
                    charged = ev["ytarget"][:, 1] != 0
                    trk_owner = set(ev["ytarget"][et == 1, 13].astype(int)) - {0}
                    for h in np.flatnonzero(rep & charged):
                        if int(ev["ytarget"][h, 13]) in trk_owner:
                            assert et[h] == 1


def test_events_are_realistic_at_low_occupancy(tiny):
    ds = open_dataset(tiny, f"{HITS_NAME}:3.2.1", ["1"], "train")
    n = [len(ds[i]["X"]) for i in range(len(ds))]
    assert 100 < np.median(n) < 600  # "a few hundred hits" at occupancy 0.03
    ev = ds[0]
    assert len(ev["genjets"]) > 0  # fastjet ee_genkt jets (fastjet is installed here)
    for i in range(len(ds)):
        X = ds[i]["X"]
        cal = X[X[:, 0] == 2]
        cells = np.unique(np.concatenate([cal[:, 10:11], cal[:, 6:9]], axis=1), axis=0)
        assert len(cells) == len(cal)  # one hit per calorimeter cell


def test_atan2_phi_invariant_to_common_positive_factor(tiny):
    def hit_phi(X):
        return np.arctan2(X[:, 3], X[:, 4])

    X = open_dataset(tiny, f"{HITS_NAME}:3.2.1", ["1"], "train")[0]["X"]
    trk = X[X[:, 0] == 1]
    # tracker hits store (sin, cos) phi times sin(theta) < 1, as the real data
    norm = np.hypot(trk[:, 3], trk[:, 4])
    assert np.all(norm < 1.0) and np.all(norm > 0)
    phi_pos = np.arctan2(trk[:, 7], trk[:, 6])
    np.testing.assert_allclose(hit_phi(trk), phi_pos, atol=1e-5)
    rng = np.random.default_rng(0)
    for factor in (1e-3, 0.37, 1.0, 42.0, rng.uniform(0.01, 100, len(X))):
        Y = X.copy()
        f = factor if np.ndim(factor) == 0 else factor
        Y[:, 3] *= f
        Y[:, 4] *= f
        np.testing.assert_allclose(hit_phi(Y), hit_phi(X), atol=1e-6)


# --------------------------------------------------------------------------------------------
# A data set written by independent code: the reader relies on the schema only


def _independent_features(nx):
    import tensorflow_datasets as tfds

    return tfds.features.FeaturesDict(
        {
            "X": tfds.features.Tensor(shape=(None, nx), dtype=np.float32),
            "ytarget": tfds.features.Tensor(shape=(None, 14), dtype=np.float32),
            "ycand": tfds.features.Tensor(shape=(None, 14), dtype=np.float32),
            "genmet": tfds.features.Scalar(dtype=np.float32),
            "genjets": tfds.features.Tensor(shape=(None, 4), dtype=np.float32),
            "targetjets": tfds.features.Tensor(shape=(None, 4), dtype=np.float32),
        }
    )


def _random_event(rng, nx, n=None):
    n = int(rng.integers(0, 40)) if n is None else n
    return {
        "X": rng.normal(size=(n, nx)).astype(np.float32),
        "ytarget": rng.normal(size=(n, 14)).astype(np.float32),
        "ycand": np.zeros((n, 14), np.float32),
        "genmet": np.float32(rng.uniform(0, 50)),
        "genjets": rng.normal(size=(int(rng.integers(0, 5)), 4)).astype(np.float32),
        "targetjets": rng.normal(size=(int(rng.integers(0, 5)), 4)).astype(np.float32),
    }


def write_independently(root, name, config, nx, splits, shards=3, poison=None):
    """ArrayRecord shards written record by record + tfds.folder_dataset.write_metadata."""
    import tensorflow_datasets as tfds
    from array_record.python.array_record_module import ArrayRecordWriter

    out = root / name / config / "3.2.1"
    out.mkdir(parents=True)
    feats = _independent_features(nx)
    rng = np.random.default_rng(123)
    events, infos = {}, []
    for split, n in splits.items():
        evs = [_random_event(rng, nx, n=0 if i == 1 else None) for i in range(n)]
        if poison is not None:
            evs[poison]["X"] = np.full((3, nx), np.nan, np.float32)
        events[split] = evs
        bounds = np.linspace(0, n, shards + 1).astype(int)
        lengths = []
        for s in range(shards):
            path = out / f"{name}-{split}.array_record-{s:05d}-of-{shards:05d}"
            w = ArrayRecordWriter(str(path), "group_size:1")
            for ev in evs[bounds[s] : bounds[s + 1]]:
                w.write(feats.serialize_example(ev))
            w.close()
            lengths.append(int(bounds[s + 1] - bounds[s]))
        infos.append(tfds.core.SplitInfo(name=split, shard_lengths=lengths, num_bytes=0))
    tfds.folder_dataset.write_metadata(
        data_dir=out, features=feats, split_infos=infos, check_data=False
    )
    return events


def test_independent_writer_config_2(tmp_path, tiny):
    events = write_independently(tmp_path, HITS_NAME, "2", 15, {"train": 11, "test": 4}, shards=3)
    ds = open_dataset(tmp_path, f"{HITS_NAME}:3.2.1", ["2"], "train")
    assert len(ds) == 11
    assert ds.metadata["synthetic"] is False  # no generator metadata: treated as real
    for i, want in enumerate(events["train"]):
        got = ds[i]
        for k in KEYS:
            np.testing.assert_array_equal(got[k], want[k].reshape(got[k].shape), err_msg=k)
    # and as a second shard next to our generated config 1
    shutil.copytree(tiny / HITS_NAME / "1", tmp_path / HITS_NAME / "1")
    both = open_dataset(tmp_path, f"{HITS_NAME}:3.2.1", ["1", "2"], "train")
    assert both.shard_sizes == [N_TRAIN, 11]
    np.testing.assert_array_equal(both[N_TRAIN + 3]["X"], events["train"][3]["X"])


# --------------------------------------------------------------------------------------------
# Errors


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match="does not exist.*heptstudy data generate"):
        open_dataset(tmp_path / "nope", f"{HITS_NAME}:3.2.1", ["1"], "train")


def test_unknown_version_lists_existing(tiny):
    with pytest.raises(DataError, match=r"version '9\.9\.9'.*available versions: \['3\.2\.1'\]"):
        open_dataset(tiny, f"{HITS_NAME}:9.9.9", ["1"], "train")


def test_unknown_config_lists_existing(tiny):
    with pytest.raises(DataError, match=r"config '5'.*available configs: \['1'\]"):
        open_dataset(tiny, f"{HITS_NAME}:3.2.1", ["1", "5"], "train")


def test_unknown_split_and_malformed_name(tiny):
    with pytest.raises(DataError, match="split 'valid'.*'test', 'train'"):
        open_dataset(tiny, f"{HITS_NAME}:3.2.1", ["1"], "valid")
    with pytest.raises(DataError, match="NAME:VERSION"):
        open_dataset(tiny, HITS_NAME, ["1"], "train")


def test_wrong_feature_count(tmp_path):
    write_independently(tmp_path, HITS_NAME, "1", 14, {"train": 3}, shards=1)
    with pytest.raises(DataError, match="14 input features.*expected 15"):
        open_dataset(tmp_path, f"{HITS_NAME}:3.2.1", ["1"], "train")


def test_nan_is_reported_not_patched(tmp_path):
    write_independently(tmp_path, HITS_NAME, "1", 15, {"train": 4}, shards=2, poison=2)
    ds = open_dataset(tmp_path, f"{HITS_NAME}:3.2.1", ["1"], "train")
    ds[0]
    with pytest.raises(DataError, match=r"event 2 .*non-finite input feature.*X\[0, 0\] = nan"):
        ds[2]


def test_generate_refuses_to_overwrite(tiny):
    with pytest.raises(DataError, match="already exists"):
        generate_datasets(tiny, 2, 2, seed=1, configs=("1",), occupancy_scale=OCC, progress=False)
    with pytest.raises(DataError, match="allowed builder configs"):
        generate_datasets(tiny, 2, 2, seed=1, configs=("11",), progress=False)


def test_metadata_file_on_disk(tiny):
    md = json.loads((tiny / HITS_NAME / "1" / "3.2.1" / "metadata.json").read_text())
    assert md["synthetic"] is True


def _second_of_three(tmp_path):
    events = write_independently(tmp_path, HITS_NAME, "1", 15, {"train": 11}, shards=3)
    folder = tmp_path / HITS_NAME / "1" / "3.2.1"
    return events, folder / f"{HITS_NAME}-train.array_record-00001-of-00003"


def test_shard_cut_at_a_block_boundary_is_refused_when_opened(tmp_path):
    # ArrayRecord reads such a file as a valid one holding no records, and TFDS then returns
    # empty examples without an error: only the record count tells
    _, second = _second_of_three(tmp_path)
    second.write_bytes(second.read_bytes()[:65536])
    with pytest.raises(DataError) as err:
        open_dataset(tmp_path, f"{HITS_NAME}:3.2.1", ["1"], "train")
    message = str(err.value)
    for fragment in (second.name, "holds 0 events", "lists 4", "truncated", "copy it again"):
        assert fragment in message, message


def test_damaged_record_is_named_and_the_other_files_still_read(tmp_path):
    events, second = _second_of_three(tmp_path)
    raw = bytearray(second.read_bytes())
    raw[100:300] = b"\x07" * 200  # inside the first record's chunk
    second.write_bytes(bytes(raw))
    ds = open_dataset(tmp_path, f"{HITS_NAME}:3.2.1", ["1"], "train")
    np.testing.assert_array_equal(ds[2]["X"], events["train"][2]["X"].reshape(-1, 15))
    with pytest.raises(DataError) as err:
        ds[3]  # global events 3..6 are the second file's records 0..3 (shard lengths 3, 4, 4)
    message = str(err.value)
    for fragment in (second.name, "record 0", "truncated, damaged or missing", "copy the file"):
        assert fragment in message, message
    np.testing.assert_array_equal(ds[8]["X"], events["train"][8]["X"].reshape(-1, 15))


def test_missing_shard_is_refused_when_opened(tmp_path):
    write_independently(tmp_path, HITS_NAME, "1", 15, {"train": 6}, shards=2)
    (
        tmp_path / HITS_NAME / "1" / "3.2.1" / f"{HITS_NAME}-train.array_record-00000-of-00002"
    ).unlink()
    with pytest.raises(DataError, match=r"lacks 1 of its 2 ArrayRecord files.*00000-of-00002"):
        open_dataset(tmp_path, f"{HITS_NAME}:3.2.1", ["1"], "train")


def test_shared_columns_sit_at_the_same_index_in_both_layouts():
    from heptstudy.data.schema import COS_PHI, ETA, SIN_PHI

    for layout in (HIT_FEATURES, PF_FEATURES):
        assert (layout.index("eta"), layout.index("sin_phi"), layout.index("cos_phi")) == (
            ETA,
            SIN_PHI,
            COS_PHI,
        )
