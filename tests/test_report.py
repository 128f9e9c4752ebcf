import json
import re
from pathlib import Path

import pytest
import torch

from heptstudy.atomic import NotJson
from heptstudy.errors import HeptstudyError
from heptstudy.measure import report as rp
from heptstudy.measure.report import (
    PROTOCOL,
    SCHEMA_VERSION,
    BenchReport,
    ReportError,
    environment_info,
    read_report,
    validate_report,
    write_report,
)
from heptstudy.model.checkpoint_plan import report_part


def _cmp(name, equal=True, diff=0.0):
    return {"name": name, "equal": equal, "max_abs_diff": diff}


def _good(kind="memory", **changes):
    env = environment_info("cpu", torch.float32, "local_cpu", fresh_process=True)
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "status": "ok",
        "name": "checkpointed_b4",
        "environment": env.model_dump(),
        "data": {
            "dataset": "cld_edm_ttbar_hits:3.2.1",
            "data_dir": "data",
            "synthetic": True,
            "split": "train",
        },
        "config": {"model": {"variant": "hit_heptv2_grouped_tracker_features"}},
        "batch_size": 4,
        "checkpointing": {"plan": "full"},
        "steps": [
            {
                "step": i,
                "counted": i >= 2,
                "event_indices": [0, 1, 2, 3],
                "hits": [100, 90, 80, 70],
                "padded_hits": [112, 96, 80, 80],
                "time_s": 0.5,
                "peak_allocated_mib": 10.0 + i,
                "peak_reserved_mib": 300.0,
                "loss": {"total": 1.5, "grouping": 0.25},
            }
            for i in range(3)
        ],
        "summary": {
            "counted_steps": 1,
            "warmup_steps": 2,
            "mean_step_time_s": 0.5,
            "max_peak_allocated_mib": 12.0,
            "max_peak_reserved_mib": 300.0,
            "tracked_memory_note": "memory from tracked steps, time from untracked steps",
        },
        "validation": {"loss": 1.2},
        "memory_categories": [
            {
                "step": 2,
                "peak_bytes": 100,
                "at_peak_bytes": {"parameters": 60, "temporaries": 40},
                "note": "at the peak",
                "timeline": [[0, 50], [1, 100]],
                "marks": [[1, "backward"]],
            }
        ],
    }
    if kind == "parity":
        cmpset = {
            "outputs": [_cmp("class_logits"), _cmp("aux0.class_logits")],
            "loss": _cmp("loss"),
            "gradients": [{"name": "w", "rel_l2": 0.0, "max_abs_diff": 0.0}],
            "num_outputs": 2,
            "num_gradients": 1,
        }
        data["parity"] = {
            "checkpointed_vs_baseline": cmpset,
            "repeat_vs_baseline": cmpset,
            "deterministic": True,
            "loss_trajectories": {"baseline": [2.0, 1.5], "checkpointed": [2.0, 1.5]},
        }
    data.update(changes)
    return data


@pytest.mark.parametrize("kind", ["memory", "parity"])
def test_round_trip(tmp_path, kind):
    path = write_report(_good(kind), tmp_path / "sub" / "r.json")
    back = read_report(path)
    assert isinstance(back, BenchReport)
    assert back.schema_version == SCHEMA_VERSION and back.protocol == PROTOCOL
    assert back.environment.fresh_process is True and back.environment.device_kind == "cpu"
    assert back.memory_categories[0].timeline == [(0, 50), (1, 100)]
    again = write_report(back, tmp_path / "r2.json")
    assert read_report(again) == back
    assert [p.name for p in tmp_path.rglob("*.tmp")] == []


def _write_raw(tmp_path, data):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


def test_missing_field_is_named(tmp_path):
    data = _good()
    del data["batch_size"]
    with pytest.raises(HeptstudyError) as e:
        read_report(_write_raw(tmp_path, data))
    msg = str(e.value)
    assert "bad.json" in msg and "batch_size" in msg and "missing" in msg


def test_wrong_type_is_named(tmp_path):
    data = _good()
    data["steps"][1]["time_s"] = "fast"
    with pytest.raises(HeptstudyError) as e:
        read_report(_write_raw(tmp_path, data))
    msg = str(e.value)
    assert "bad.json" in msg and "steps.1.time_s" in msg and "'fast'" in msg


def test_wrong_or_missing_schema_version(tmp_path):
    data = _good()
    data["schema_version"] = "heptstudy.bench/0"
    with pytest.raises(HeptstudyError, match=r"bad.json: schema_version is 'heptstudy.bench/0'"):
        read_report(_write_raw(tmp_path, data))
    del data["schema_version"]
    with pytest.raises(HeptstudyError, match="schema_version is missing"):
        read_report(_write_raw(tmp_path, data))


def test_unreadable_and_inconsistent_files(tmp_path):
    path = tmp_path / "trunc.json"
    path.write_text('{"schema_version": "heptstudy.bench/1", "kind": ')
    with pytest.raises(HeptstudyError, match="trunc.json: not valid JSON"):
        read_report(path)
    with pytest.raises(HeptstudyError, match="cannot read"):
        read_report(tmp_path / "absent.json")
    with pytest.raises(HeptstudyError, match="oom"):
        read_report(_write_raw(tmp_path, _good(status="oom", summary=None)))
    with pytest.raises(HeptstudyError, match="unknown field"):
        read_report(_write_raw(tmp_path, _good(colour="blue")))


def test_oom_report_round_trips(tmp_path):
    oom = {
        "message": "CUDA out of memory",
        "batch_size": 16,
        "padded_hits": [9000] * 16,
        "phase": "backward",
    }
    path = write_report(_good(status="oom", summary=None, steps=[], oom=oom), tmp_path / "o.json")
    assert read_report(path).oom.padded_hits == [9000] * 16


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = write_report(_good(), tmp_path / "r.json")
    before = path.read_bytes()
    with pytest.raises(HeptstudyError):
        write_report(_good(batch_size="four"), path)  # invalid: rejected before writing

    with pytest.raises(NotJson):  # serialisation refuses: nothing written
        write_report(_good(config={"model": {"budget": float("inf")}}), path)

    def fail_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(rp.os, "replace", fail_replace)
    with pytest.raises(OSError):
        write_report(_good(batch_size=8), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_dict_without_version_is_written_with_the_current_one(tmp_path):
    data = _good()
    del data["schema_version"]
    assert read_report(write_report(data, tmp_path / "r.json")).schema_version == SCHEMA_VERSION


def test_mutated_report_is_revalidated(tmp_path):
    report = BenchReport.model_validate(_good())
    report.batch_size = 0  # not validated on assignment
    with pytest.raises(HeptstudyError, match="batch_size"):
        write_report(report, tmp_path / "r.json")


def test_environment_helpers():
    env = environment_info("cpu", "bfloat16", None)
    assert env.dtype == "bfloat16" and env.threads == torch.get_num_threads()
    assert env.torch_version == torch.__version__
    assert rp.claim_fresh_process() is False  # environment_info above claimed it
    assert env.git_commit is None or len(env.git_commit) == 40


def test_git_dirty_counts_code_not_results(tmp_path):
    import subprocess

    from heptstudy.measure.report import git_dirty

    def git(*args):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    for rel in ("pkg/code.py", "experiments/run.json", "figures/fig.png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("v1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "init")
    assert git_dirty(tmp_path / "pkg") is False
    (tmp_path / "experiments/run.json").write_text("v2\n")
    (tmp_path / "figures/fig.png").unlink()
    (tmp_path / "pkg/new_untracked.py").write_text("x\n")
    assert git_dirty(tmp_path / "pkg") is False  # results and untracked files do not count
    (tmp_path / "pkg/code.py").write_text("v2\n")
    assert git_dirty(tmp_path / "pkg") is True


def _committed_reports():
    root = Path(__file__).resolve().parent.parent / "experiments"
    return sorted(
        p for p in root.rglob("*.json") if '"schema_version": "heptstudy.bench/' in p.read_text()
    )


@pytest.mark.parametrize("path", _committed_reports(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_reports_read_as_written(path):
    """Every committed report is in the current schema: read as it is on disk, its plan named
    alike in its checkpointing block, its configuration and its name."""
    report = read_report(path)
    plan = report.config["model"]["heptv2"]["activation_checkpointing"]
    assert report.plan.name == plan
    if report.kind == "memory":
        assert report.checkpointing.plan == plan
        packed = "packed_" if report.config["data"].get("batching") == "packed" else ""
        assert report.name == f"{packed}{report_part(plan)}_b{report.batch_size}"
    else:
        assert report.checkpointing.plan is None and plan == "off"
    if report.summary is not None and report.summary.mean_phase_time_s is None:
        assert all(s.phase_time_s is None for s in report.steps)


def test_breakdown_and_parity_fields_round_trip(tmp_path):
    data = _good()
    data["steps"][0]["phase_time_s"] = {"backbone_forward": 0.2, "backward": 0.3}
    data["summary"]["mean_phase_time_s"] = {"backbone_forward": 0.2, "backward": 0.3}
    data["summary"]["phase_time_definition"] = "wall clock"
    write_report(data, tmp_path / "m.json")
    assert read_report(tmp_path / "m.json").summary.mean_phase_time_s["backward"] == 0.3
    parity = _good("parity")
    cmp = parity["parity"]["checkpointed_vs_baseline"]
    cmp["outputs"][0]["shape"] = [1, 12, 6]
    cmp["overall_rel_l2"] = 0.0
    cmp["loss_components"] = [_cmp("total")]
    write_report(parity, tmp_path / "p.json")
    again = read_report(tmp_path / "p.json").parity.checkpointed_vs_baseline
    assert again.outputs[0].shape == [1, 12, 6] and again.loss_components[0].name == "total"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_no_report_holds_nan_or_infinity(tmp_path, value):
    """Not JSON: refused when written, naming the field, and when read from a file."""
    data = _good()
    data["steps"][0]["loss"]["grouping"] = value
    with pytest.raises(ReportError) as err:
        write_report(data, tmp_path / "r.json")
    assert re.search(
        r"steps\.0\.loss\.grouping=\S+ is not allowed: Input should be a finite number",
        str(err.value),
    )
    data = _good(config={"model": {"heptv2": {"memory_budget_gib": value}}})
    with pytest.raises(NotJson) as err:
        write_report(data, tmp_path / "r.json")
    assert f"config.model.heptv2.memory_budget_gib is {value}, which JSON cannot hold" in str(
        err.value
    )
    assert not (tmp_path / "r.json").exists()
    good = write_report(_good(), tmp_path / "good.json").read_text()
    word = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[str(value)]
    (tmp_path / "r.json").write_text(good.replace('"grouping": 0.25', f'"grouping": {word}'))
    with pytest.raises(ReportError, match=f"holds {word}, which is not a JSON number"):
        read_report(tmp_path / "r.json")


def test_a_report_from_before_the_plans_names_is_refused_naming_its_fields():
    """A plan spread over enabled, policy and checkpoint_every (reports before the plans had
    names, experiments/HISTORY.md) is not read as some plan: each field is named."""
    old = _good(checkpointing={"enabled": True, "policy": "selective", "checkpoint_every": 3})
    with pytest.raises(ReportError) as err:
        validate_report(old, "old.json")
    for field in ("enabled=True", "policy='selective'", "checkpoint_every=3"):
        assert f"unknown field checkpointing.{field}" in str(err.value)
    assert str(err.value).startswith("old.json: not a valid heptstudy report")
