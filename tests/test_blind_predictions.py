"""The committed blind predictions of the GPU study are of the code as it is."""

import json
from pathlib import Path

from heptstudy.estimate.predictions import PREDICTIONS, REGENERATE, stale_parts
from heptstudy.study.matrix import load_matrix

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "configs" / "study" / "gpu.yaml"


def test_blind_predictions_are_of_this_code():
    doc = json.loads((REPO / PREDICTIONS).read_text())
    stale = stale_parts(doc, MATRIX)
    assert not stale, (
        f"{PREDICTIONS} was made from other code ({', '.join(stale)} changed since): regenerate "
        f"it with `{REGENERATE}` and commit it before any GPU measures this code"
    )


def test_every_memory_run_is_predicted_or_says_why_not():
    doc = json.loads((REPO / PREDICTIONS).read_text())
    names = {run.name for run in load_matrix(MATRIX).runs}
    assert set(doc["runs"]) | set(doc["not_predicted"]) == names
    for name, run in doc["runs"].items():
        assert run["target"] == "cuda" and run["torch_version"] == "2.11", name
        for field in ("allocated_mib", "reserved_mib", "expandable_reserved_mib"):
            assert run[field] > 0, (name, field)
        assert run["reserved_mib"] >= run["allocated_mib"], name


def test_stale_parts_names_a_changed_part(tmp_path):
    doc = json.loads((REPO / PREDICTIONS).read_text())
    doc["fingerprint"]["code"]["model"] = "0" * 64
    assert stale_parts(doc, MATRIX) == ["model code"]


def test_predict_matrix_runs_the_target_faithful_bench_process(tmp_path, tiny_data_dir):
    import yaml

    from heptstudy.study.blind_predictions import predict_matrix
    from tests.conftest import TINY_MODEL

    matrix = tmp_path / "tiny.yaml"
    matrix.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "description": "tiny model, generated data",
                "defaults": {"platform": "h100", "steps": 1, "warmup": 1},
                "runs": [
                    {"batch_size": 2, "checkpointing": True, "overrides": list(TINY_MODEL)},
                    {"batch_size": 2, "checkpointing": "auto", "overrides": list(TINY_MODEL)},
                ],
            }
        )
    )
    doc = predict_matrix(str(matrix), str(tiny_data_dir), progress=lambda _line: None)
    ((name, run),) = doc["runs"].items()
    assert name == "checkpointed_b2" and list(doc["not_predicted"]) == ["auto_b2"]
    assert run["target"] == "cuda" and len(run["per_step"]) == 2
    assert run["reserved_mib"] >= run["allocated_mib"] > 0
    # the decoder's attention runs CUDA's SDPA stand-in; the model's dropout keeps CUDA's boolean
    # mask itself (native_dropout), so the dropout stand-in is not needed
    hits = run["hits_of_the_last_step"]["stand_ins"]
    assert hits["scaled_dot_product_attention"] > 0 and "dropout" not in hits
    assert list(doc["fingerprint"]["platforms"]) == ["configs/training/platforms/h100.yaml"]


def test_gpu_session_is_compared_with_the_predictions(tmp_path):
    import runpy

    doc = json.loads((REPO / PREDICTIONS).read_text())
    predicted = doc["runs"]["checkpointed_b48"]
    out = tmp_path / "out"
    (out / "study").mkdir(parents=True)
    report = {
        "status": "ok",
        "environment": {"git_commit": "abc"},
        "summary": {
            "max_peak_allocated_mib": predicted["allocated_mib"] * 1.02,
            "max_peak_reserved_mib": predicted["reserved_mib"] * 0.95,
        },
    }
    (out / "study" / "checkpointed_b48.json").write_text(json.dumps(report))
    (out / "study" / "parity_b1.json").write_text(json.dumps({"status": "ok"}))
    script = runpy.run_path(str(REPO / "scripts" / "gpu" / "compare_predictions.py"))
    assert script["main"]([str(out)]) == 0
    rows = json.loads((out / "predictions_vs_measured.json").read_text())["rows"]
    row = next(r for r in rows if r["run"] == "study/checkpointed_b48")
    assert abs(row["allocated_error"] - (1 / 1.02 - 1)) < 1e-9
    assert abs(row["reserved_error"] - (1 / 0.95 - 1)) < 1e-9
    assert {"run": "study/parity_b1", "skipped": True} in rows
    assert "study/checkpointed_b48" in (out / "predictions_vs_measured.md").read_text()
