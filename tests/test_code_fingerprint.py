"""Stored memory models carry the fingerprint of the code they were made from, are refused with
the reason when it changed, and the fit's criterion on GPU platforms is reserved memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from heptstudy import fingerprint as cf
from heptstudy.estimate.keys import model_key
from heptstudy.estimate.memory_model import LinearFit, MemoryModel, ReservedFit
from heptstudy.fitting.predict import evaluate
from heptstudy.fitting.select import STALE_PREFIX, choose_model
from heptstudy.measure.report import read_report

REPO = Path(__file__).resolve().parents[1]
FITS = REPO / "configs" / "fit"
H200 = REPO / "experiments" / "h200_2026-11-30"
MEASURED_ON = "9a5529c"  # the commit the H200 reports measured (their README)


def _copy_code(dst: Path) -> Path:
    for part in ("model", "train", "meters", "estimate", "stand_ins.py"):
        src = REPO / "heptstudy" / part
        if src.is_dir():
            shutil.copytree(
                src, dst / "heptstudy" / part, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(src, dst / "heptstudy" / part)
    return dst


def test_part_hashes_name_the_part_that_changed(tmp_path):
    root = _copy_code(tmp_path)
    before = cf.part_hashes(root=root)
    assert before == cf.part_hashes()  # the copy is the code that runs
    layer = root / "heptstudy" / "model" / "heptv2.py"
    layer.write_text(layer.read_text() + "\n# an edit\n")
    after = cf.part_hashes(root=root)
    assert after["model"] != before["model"]
    assert (after["step"], after["estimate"]) == (before["step"], before["estimate"])
    # a new file of a part changes it too, in a sub-folder as well; a file outside every part
    # changes none
    (root / "heptstudy" / "model" / "extra").mkdir()
    (root / "heptstudy" / "model" / "extra" / "kernels.py").write_text("# new\n")
    assert cf.part_hashes(root=root)["model"] != after["model"]
    (root / "heptstudy" / "train" / "step.py").rename(root / "heptstudy" / "train" / "step2.py")
    assert cf.part_hashes(root=root)["step"] != before["step"]
    (root / "heptstudy" / "estimate" / "plans.py").write_text("# fit-side code\n")
    assert cf.part_hashes(root=root)["estimate"] == before["estimate"]


def _estimated_model(key, fingerprint) -> MemoryModel:
    return MemoryModel(
        key=key,
        source="estimated",
        source_detail="hand-made",
        allocated=LinearFit(100.0, 0.01, 0.0),
        reserved=ReservedFit(1.2),
        allocated_points=[],
        fingerprint=fingerprint,
    )


def _key():
    return model_key(read_report(H200 / "checkpointed_b48.json").config, "cuda")


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda fp: fp["parts"].update(model="0" * 64), "model code (heptstudy/model/) changed"),
        (lambda fp: fp["parts"].update(step="0" * 64), "step code (train/step, losses, LAMB"),
        (lambda fp: fp["parts"].update(estimate="0" * 64), "estimate code (fake step, simulator"),
        (lambda fp: fp.update(torch="2.11.0+cu130"), "PyTorch 2.11.0+cu130 then"),
        (lambda fp: fp.update(config_key="abc"), "configuration key changed (model_hash abc"),
        (lambda fp: fp.clear(), "records no code fingerprint"),
    ],
)
def test_stored_model_from_other_code_is_refused_with_the_reason(tmp_path, change, reason):
    key = _key()
    fits = tmp_path / "fits"
    fits.mkdir()
    _estimated_model(key, cf.make("estimated", key)).save(fits / "current.json")
    choice = choose_model(key, (), fits)
    assert choice.model is not None and choice.not_used == []  # of this code: used
    fp = cf.make("estimated", key)
    change(fp)
    _estimated_model(key, fp or None).save(fits / "current.json")
    choice = choose_model(key, (), fits)
    assert choice.model is None
    (why,) = [r.reason for r in choice.not_used]
    assert reason in why
    assert "Regenerate: scripts/regenerate_fits.sh" in why


def test_h200_models_are_labelled_measured_on_their_commit_and_shown_not_used():
    key = _key()
    choice = choose_model(key, (), FITS)
    assert choice.model is None or choice.model.source == "estimated"
    stale = [r for r in choice.not_used if r.path.endswith("_measured.json")]
    assert stale and all(f"measured on commit {MEASURED_ON}" in r.reason for r in stale)
    assert all("model code (heptstudy/model/) changed" in r.reason for r in stale)
    assert all("measure the configuration again on the GPU" in r.reason for r in stale)
    # the one of the same configuration stays beside the answer, labelled
    shown = [d for _, m, d in choice.cross_checks if m.source == "measured"]
    assert len(shown) == 1 and shown[0][-1].startswith(f"{STALE_PREFIX} (measured on commit")


def test_h200_fingerprints_are_the_code_of_that_commit():
    try:
        at = cf.part_hashes_at(MEASURED_ON, ("model", "step"))
    except cf.CommitUnreadable:
        pytest.skip(f"git or commit {MEASURED_ON} not available here")
    for path in FITS.glob("*_measured.json"):
        fp = MemoryModel.load(path).fingerprint
        assert fp["commit"].startswith(MEASURED_ON) and fp["parts"] == at
        assert fp["torch"] == "2.11.0+cu130"


def test_expandable_segments_platform_is_judged_on_its_own_reserved():
    from heptstudy.config import PlatformConfig
    from heptstudy.fitting.api import expandable_segments

    mm = _estimated_model({}, None)
    mm.reserved_expandable = ReservedFit(1.05)
    # 100 MiB + 0.01 MiB per padded hit; B=2, L=1000: 120 MiB allocated, 144 reserved natively,
    # 126 with expandable segments; 130 MiB usable: fits only with expandable segments
    usable_gib = 130 / 1024
    native = evaluate(mm, [1000, 1000], 2, usable_gib)
    assert native.criterion.quantity == "reserved" and not native.fits
    assert native.worst_batch["reserved_gib"] * 1024 == pytest.approx(144)
    expandable = evaluate(mm, [1000, 1000], 2, usable_gib, expandable_segments=True)
    assert expandable.criterion.quantity == "reserved_expandable" and expandable.fits
    assert expandable.worst_batch["reserved_expandable_gib"] * 1024 == pytest.approx(126)

    def platform(env):
        return PlatformConfig(
            name="p",
            device="cuda",
            devices_per_node=1,
            device_memory_gib=80,
            dtype="bfloat16",
            attention_backend="plain",
            launcher="local",
            env=env,
        )

    assert expandable_segments(platform({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
    assert expandable_segments(
        platform({"PYTORCH_HIP_ALLOC_CONF": "max_split_size_mb:512,expandable_segments:True"})
    )
    assert not expandable_segments(platform({}))
    assert not expandable_segments(
        platform({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    )


def test_estimated_gpu_model_carries_reserved_of_both_modes(tiny_data_dir, tiny_overrides):
    from heptstudy.config import load_config
    from heptstudy.estimate.fake_step import estimate_memory_model

    config = load_config(overrides=[*tiny_overrides, f"data.data_dir={tiny_data_dir}"])
    mm = estimate_memory_model(config, 2, "cuda")
    assert mm.reserved is not None and mm.reserved_expandable is not None
    assert len(mm.reserved_points) == len(mm.reserved_expandable_points) == len(mm.allocated_points)
    for a, r in zip(mm.allocated_points, mm.reserved_points, strict=True):
        assert r.peak_mib >= a.peak_mib  # the pool holds at least what is allocated
    assert cf.stale_reasons(mm.fingerprint, "estimated", mm.key) == []
    again = MemoryModel.from_dict(mm.to_dict())
    assert again.reserved_expandable == mm.reserved_expandable
    assert again.fingerprint == mm.fingerprint


def test_answer_names_a_measured_model_of_older_code_it_did_not_use(
    tiny_data_dir, tiny_overrides, tmp_path
):
    from heptstudy.fitting import FitRequest, fit
    from heptstudy.fitting.api import resolve_config

    request = FitRequest(
        platform="h100",
        per_device_batch=4,
        data_dir=str(tiny_data_dir),
        overrides=tuple(tiny_overrides),
        fits_dir=str(tmp_path),
        estimate_if_missing=False,
    )
    _, rv, _ = resolve_config(request)
    key = model_key(rv.config.to_dict(), "cuda")
    _estimated_model(key, cf.make("estimated", key)).save(tmp_path / "estimated.json")
    old = _estimated_model(key, None)
    old.source, old.reserved = "measured", ReservedFit(2.0)
    old.fingerprint = cf.make("measured", key, torch_version="2.11.0+cu130")
    old.fingerprint["parts"]["model"] = "0" * 64
    old.fingerprint["commit"] = "9a5529cdf8da7b06cd08d9c40f633f7e3bab747d"
    old.save(tmp_path / "measured.json")
    result = fit(request)
    assert result.model.source == "estimated" and result.model_origin.endswith("estimated.json")
    words = result.words()
    assert (
        "NOT USED: the MEASURED model, measured on older code (measured on commit 9a5529cdf: "
        in words
    )
    assert "model code (heptstudy/model/) changed" in words


def test_fit_estimate_save_model_regenerates_a_model_fit_then_uses(
    tiny_data_dir, tiny_overrides, tmp_path, capsys
):
    """What scripts/regenerate_fits.sh runs, on the tiny model at one event per device."""
    from heptstudy.cli import main
    from heptstudy.fitting import FitRequest, fit

    fits = tmp_path / "fits"
    fits.mkdir()
    args = ["fit", "--platform", "lumi_mi250x", "--per-device-batch", "1"]
    args += ["--data-dir", str(tiny_data_dir), *(f"--set={o}" for o in tiny_overrides)]
    assert main([*args, "--estimate", "--save-model", str(fits / "lumi.json")]) == 0
    assert "estimated now on a fake device (--estimate)" in capsys.readouterr().out
    stored = MemoryModel.load(fits / "lumi.json")
    assert stored.fingerprint["made_from"] == "estimated" and stored.reserved is not None
    result = fit(
        FitRequest(
            platform="lumi_mi250x",
            per_device_batch=1,
            data_dir=str(tiny_data_dir),
            overrides=tuple(tiny_overrides),
            fits_dir=str(fits),
            estimate_if_missing=False,
        )
    )
    assert result is not None and result.model_origin == str(fits / "lumi.json")
    assert result.answer.criterion.quantity == "reserved"


def test_a_fit_from_reports_says_whether_they_measured_this_code(tiny_data_dir, tmp_path):
    import re

    from heptstudy.fitting import FitRequest, fit

    text = (REPO / "configs/training/platforms/h100.yaml").read_text()
    plain = tmp_path / "h100_plain.yaml"
    plain.write_text(re.sub(r"(?m)^attention_backend:.*$", "attention_backend: plain", text))
    result = fit(FitRequest(platform=str(plain), data_dir=str(tiny_data_dir), reports=(str(H200),)))
    assert result.model_origin.startswith("reports")
    # the H200 copy's own commit is not in this repository: said, not guessed
    assert any("which this repository does not hold" in n for n in result.notes)
    assert cf.commit_reasons(MEASURED_ON) in (
        None,
        [
            "model code (heptstudy/model/) changed",
            "step code (train/step, losses, LAMB, optimizer, precision) changed",
        ],
    )
