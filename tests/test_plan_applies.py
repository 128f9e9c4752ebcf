"""A checkpointing plan is what runs: a model it cannot apply to refuses it, before anything is
measured or written."""

import pytest

from heptstudy.config import FIXED_PLANS, TRACK_CLUSTER_VARIANT, load_config
from heptstudy.errors import ConfigError, HeptstudyError
from heptstudy.measure import bench
from heptstudy.model import build_model
from heptstudy.model.checkpoint_plan import FULL, NAMED, OFF, apply_plan, plan_named
from tests.conftest import TINY_MODEL, tiny_request

TRACK_CLUSTER = [f"model.variant={TRACK_CLUSTER_VARIANT}", "data.dataset=cld_edm_ttbar_pf:3.2.1"]


def _track_cluster(plan: str):
    return load_config(
        overrides=[*TINY_MODEL, *TRACK_CLUSTER, f"model.heptv2.activation_checkpointing={plan}"]
    )


@pytest.mark.parametrize("plan", [p for p in FIXED_PLANS if p != "off"] + ["layers1"])
def test_the_reference_model_refuses_every_plan_but_off(plan):
    with pytest.raises(ConfigError) as refused:
        build_model(_track_cluster(plan))
    words = str(refused.value)
    assert f"activation_checkpointing={plan}" in words and TRACK_CLUSTER_VARIANT in words
    assert "takes only off" in words
    assert build_model(_track_cluster("off")) is not None


def test_a_plan_on_a_model_without_backbone_layers_is_refused():
    model = build_model(_track_cluster("off"))
    for plan in (FULL, NAMED["every2"], NAMED["auto"], plan_named("layers1", 3)):
        with pytest.raises(HeptstudyError, match=f"{plan.name} checkpoints none of the layers"):
            apply_plan(build_model(_track_cluster("off")), plan)
    assert apply_plan(model, OFF).checkpoint_plan is OFF


def test_bench_refuses_a_plan_on_the_reference_model_before_measuring(
    tiny_data_dir, tmp_path, monkeypatch
):
    def measured(*args, **kwargs):
        raise AssertionError("a step ran although the plan should have been refused first")

    monkeypatch.setattr(bench, "run_step", measured)
    monkeypatch.setattr(bench, "run_parity", measured)
    output = tmp_path / "checkpointed_b2.json"
    request = tiny_request(
        tiny_data_dir, output, batch_size=2, checkpointing="full", variant=TRACK_CLUSTER_VARIANT
    )
    with pytest.raises(ConfigError, match=TRACK_CLUSTER_VARIANT):
        bench.run_bench(request.resolve())
    assert not output.exists()


def _hit_model(plan: str, backbone: int, decoder: int):
    return build_model(
        load_config(
            overrides=[
                *TINY_MODEL,
                f"model.heptv2.num_convs={backbone}",
                f"model.decoder.num_layers={decoder}",
                f"model.heptv2.activation_checkpointing={plan}",
            ]
        )
    )


def _wrapped(model) -> set[str]:
    return {
        name
        for name, module in model.named_modules()
        if name.count(".") == 1 and type(module).__name__ == "CheckpointWrapper"
    }


@pytest.mark.parametrize(
    "plan,backbone,decoder,equal",
    [("every2", 1, 1, "full"), ("every3", 1, 1, "full"), ("every3", 2, 2, "every2")],
)
def test_an_every_plan_that_equals_a_simpler_one_is_refused(plan, backbone, decoder, equal):
    with pytest.raises(HeptstudyError) as refused:
        _hit_model(plan, backbone, decoder)
    words = str(refused.value)
    assert f"{plan} checkpoints the same layers as {equal}" in words
    assert f"activation_checkpointing={equal}" in words
    assert f"backbone: {backbone} layer" in words and f"decoder: {decoder} layer" in words


def test_an_every_plan_runs_where_it_differs_from_full():
    # one backbone layer, but a decoder of two: every2 leaves the second decoder layer alone
    every2, full = _hit_model("every2", 1, 2), _hit_model("full", 1, 2)
    assert _wrapped(every2) == {"backbone.0", "decoder.0"} < _wrapped(full)
    assert _wrapped(_hit_model("selective", 1, 1)) == _wrapped(_hit_model("full", 1, 1))
