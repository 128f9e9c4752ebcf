"""The blind predictions' machinery: their prediction of a matrix, the check that they are of
this checkout (scripts/gpu/check_predictions.py, `make check-predictions`, which leaves the
freshness of the committed file out of the tests) and the GPU session's facts."""

import json
import runpy
from pathlib import Path

import pytest
import yaml

from heptstudy.errors import HeptstudyError
from heptstudy.estimate.predictions import (
    PREDICTIONS,
    REGENERATE,
    fingerprint,
    read_predictions,
    session_facts,
)
from heptstudy.study.blind_predictions import predict_matrix
from heptstudy.study.matrix import load_matrix
from tests.conftest import TINY_MODEL

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "configs" / "study" / "gpu.yaml"
CHECK = runpy.run_path(str(REPO / "scripts" / "gpu" / "check_predictions.py"))


@pytest.fixture
def fresh():
    """Predictions of this checkout: every run of the matrix for the GPU session's target."""
    session = session_facts()
    version = ".".join(session["torch_version"].split(".")[:2])
    run = {"target": session["device_kind"], "torch_version": version}
    names = [r.name for r in load_matrix(MATRIX).runs]
    return {
        "runs": {name: dict(run) for name in names[1:]},
        "not_predicted": {names[0]: "a reason"},
        "fingerprint": fingerprint(MATRIX, [REPO / "configs/training/platforms/h100.yaml"]),
    }


def test_the_check_names_what_differs_from_this_checkout(fresh):
    assert CHECK["problems"](fresh, MATRIX, session_facts()) == []
    fresh["fingerprint"]["code"]["model"] = "0" * 64
    name, run = next(iter(fresh["runs"].items()))
    run["torch_version"] = "2.9"
    del fresh["not_predicted"][next(iter(fresh["not_predicted"]))]
    found = CHECK["problems"](fresh, MATRIX, session_facts())
    assert found[0] == "model code changed since they were made"
    assert "neither predicted nor said why not" in found[1]
    assert name in found[2] and "2.9" in found[2]


def test_stale_predictions_fail_the_check_naming_the_regeneration(tmp_path, capsys):
    doc = read_predictions(REPO / PREDICTIONS)
    doc["fingerprint"]["code"]["step"] = "0" * 64
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(doc))
    assert CHECK["main"](["--predictions", str(path)]) == 1
    err = capsys.readouterr().err
    assert "step code changed" in err and REGENERATE in err


def test_damaged_session_facts_are_refused(tmp_path):
    path = tmp_path / "session.yaml"
    path.write_text(json.dumps({"device_kind": "cuda", "data": {"events_train": 144}}))
    with pytest.raises(HeptstudyError, match="events_test, seed"):
        session_facts(path)


def test_predict_matrix_runs_the_target_faithful_bench_process(tmp_path, tiny_data_dir):
    matrix = tmp_path / "tiny.yaml"
    matrix.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "description": "tiny model, generated data",
                "defaults": {"platform": "h100", "steps": 1, "warmup": 1},
                "runs": [
                    {"batch_size": 1, "checkpointing": False, "overrides": list(TINY_MODEL)},
                    {"batch_size": 2, "checkpointing": True, "overrides": list(TINY_MODEL)},
                    {"batch_size": 2, "checkpointing": "auto", "overrides": list(TINY_MODEL)},
                ],
            }
        )
    )
    said = []
    doc = predict_matrix(str(matrix), str(tiny_data_dir), progress=said.append, jobs=2)
    # two processes: the larger run started first, the file in the matrix's order
    assert [line.split(":")[0].strip() for line in said] == ["checkpointed_b2", "baseline_b1"]
    assert list(doc["runs"]) == ["baseline_b1", "checkpointed_b2"]
    assert list(doc["not_predicted"]) == ["auto_b2"]
    run = doc["runs"]["checkpointed_b2"]
    assert run["target"] == "cuda" and len(run["per_step"]) == 2
    assert run["reserved_mib"] >= run["allocated_mib"] > 0
    # the decoder's attention runs CUDA's SDPA stand-in; the model's dropout keeps CUDA's boolean
    # mask itself (native_dropout), so the dropout stand-in is not needed
    hits = run["hits_of_the_last_step"]["stand_ins"]
    assert hits["scaled_dot_product_attention"] > 0 and "dropout" not in hits
    assert list(doc["fingerprint"]["platforms"]) == ["configs/training/platforms/h100.yaml"]
