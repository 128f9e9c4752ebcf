"""The committed blind predictions of the GPU study are of the code as it is."""

from pathlib import Path

import yaml

from heptstudy.estimate.predictions import (
    PREDICTIONS,
    REGENERATE,
    fingerprint,
    read_predictions,
    stale_parts,
)
from heptstudy.study.blind_predictions import predict_matrix
from heptstudy.study.matrix import load_matrix
from tests.conftest import TINY_MODEL

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "configs" / "study" / "gpu.yaml"


def test_blind_predictions_are_of_this_code():
    doc = read_predictions(REPO / PREDICTIONS)
    stale = stale_parts(doc, MATRIX)
    assert not stale, (
        f"{PREDICTIONS} was made from other code ({', '.join(stale)} changed since): regenerate "
        f"it with `{REGENERATE}` and commit it before any GPU measures this code"
    )


def test_every_memory_run_is_predicted_or_says_why_not():
    # read_predictions refuses figures no run can have (tests/test_compare_predictions.py)
    doc = read_predictions(REPO / PREDICTIONS)
    names = {run.name for run in load_matrix(MATRIX).runs}
    assert set(doc["runs"]) | set(doc["not_predicted"]) == names
    for name, run in doc["runs"].items():
        assert run["target"] == "cuda" and run["torch_version"] == "2.11", name


def test_stale_parts_names_a_changed_part():
    doc = read_predictions(REPO / PREDICTIONS)
    doc["fingerprint"] = fingerprint(MATRIX, [REPO / "configs/training/platforms/h100.yaml"])
    assert stale_parts(doc, MATRIX) == []
    doc["fingerprint"]["code"]["model"] = "0" * 64
    assert stale_parts(doc, MATRIX) == ["model code"]


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
