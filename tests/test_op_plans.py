"""``ops`` plans: a checkpointed layer keeps chosen op groups (heptstudy.model.op_groups) and
recomputes the rest, with the results of ``off``; the groups' ops are dispatcher ops a policy
can keep, and their bytes come from a fake-tensor forward.

Tolerance: outputs and losses exactly equal; gradients within relative L2 ``GRAD_RTOL`` (the
packed/padded parity tolerance of tests/test_packed.py), though they come out equal."""

from __future__ import annotations

import pytest
import torch

from heptstudy.config import load_config
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.fake_step import estimate_step
from heptstudy.estimate.group_bytes import op_group_bytes
from heptstudy.measure.parity import build_seeded
from heptstudy.meters.memory import StorageTracker
from heptstudy.model import example_batch, heptv2
from heptstudy.model.checkpoint_plan import FULL, OFF, apply_plan, plan_named, unwrapped_name
from heptstudy.model.heptv2 import HEPTv2Layer, hit_coordinates
from heptstudy.model.op_groups import GROUP_NAMES, GROUPS, kept_pairs
from heptstudy.train.step import run_step
from tests.conftest import TINY_MODEL

GRAD_RTOL = 1e-5
CPU = torch.device("cpu")
LENGTHS = [70, 41, 23]
KEEP = {"order", "attention", "dropout"}


def _config(*extra):
    return load_config(overrides=[*TINY_MODEL, "model.heptv2.dropout=0.3", *extra])


def _step(config, batch, plan=None, seed=7):
    model = build_seeded(config, CPU).train()
    torch.manual_seed(seed)
    result = run_step(model, batch, None, None, config, None, keep_outputs=True, plan=plan)
    grads = {
        unwrapped_name(n): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }
    return result, grads, torch.get_rng_state()


def _assert_parity(batching, keep, *extra):
    off = _config(*extra)
    auto = _config("model.heptv2.activation_checkpointing=auto", *extra)
    batch = example_batch(off, len(LENGTHS), LENGTHS, seed=5, batching=batching)
    base, base_grads, base_rng = _step(off, batch)
    ops, ops_grads, ops_rng = _step(auto, batch, plan_named("test", keep=keep))
    assert base.outputs.keys() == ops.outputs.keys()
    for k in base.outputs:
        assert torch.equal(base.outputs[k], ops.outputs[k]), k
    assert torch.equal(base.losses["total"], ops.losses["total"])
    assert base_grads.keys() == ops_grads.keys() and len(base_grads) > 50
    for n in base_grads:
        diff = float((base_grads[n] - ops_grads[n]).norm())
        assert diff <= GRAD_RTOL * float(base_grads[n].norm()), n
    assert torch.equal(base_rng, ops_rng)
    # dropout was drawn: another seed changes the outputs
    other, _, _ = _step(off, batch, seed=8)
    assert not torch.equal(base.outputs["class_logits"], other.outputs["class_logits"])


@pytest.mark.parametrize("batching", ["padded", "packed"])
def test_ops_plan_parity_keeping_order_attention_and_dropout(batching):
    _assert_parity(batching, KEEP)


def test_ops_plan_parity_padded():
    _assert_parity("padded", KEEP | {"qkv", "qk_norm", "mlp", "cross_kv"})


def test_ops_plan_parity_packed():
    _assert_parity("packed", KEEP | {"pos_embed", "out_proj", "mlp_norm", "ffn"})


def test_ops_plan_parity_with_every_group_and_decoder_dropout():
    """The decoder's self-attention draws its own dropout: its layers then replay every mask
    rather than keep some (op_groups.effective_keep); the backbone keeps them."""
    _assert_parity("padded", GROUP_NAMES, "model.decoder.dropout=0.2")


def _counting(monkeypatch, name):
    calls = []
    real = getattr(heptv2, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(heptv2, name, counted)
    return calls


@pytest.mark.parametrize(
    "group,kernel",
    [("order", "_hash_and_sort"), ("attention", "_attention_forward"), ("mlp", "_swiglu_rows")],
)
def test_a_kept_group_is_not_recomputed(monkeypatch, group, kernel):
    """Keeping the bucket order: backward neither hashes nor sorts (as many hashings as an
    uncheckpointed step); ``full`` hashes again in every layer's backward. Keeping the
    attention or the SwiGLU: backward does not run its forward again."""
    calls = _counting(monkeypatch, kernel)
    batch = example_batch(_config(), 2, [40, 30], seed=1)
    counts = {}
    for name, plan in [
        ("off", None),
        ("kept", plan_named("kept", keep={group})),
        ("recomputed", plan_named("recomputed", keep=GROUP_NAMES - {group})),
        ("full", FULL),
    ]:
        config = _config(
            f"model.heptv2.activation_checkpointing={'off' if plan is None else 'auto'}"
        )
        calls.clear()
        _step(config, batch, plan)
        counts[name] = len(calls)
    layers = _config().model.heptv2.num_convs
    assert counts["off"] == layers
    assert counts["kept"] == counts["off"]
    assert counts["recomputed"] == counts["full"] == 2 * layers


def test_group_table_is_one_group_per_op_and_names_real_submodules():
    config = _config()
    model = build_seeded(config, CPU)
    for kind, groups in GROUPS.items():
        pairs = [
            (op, module)
            for g in groups
            for op in g.ops
            for module in (g.modules if g.modules is not None else (None,))
        ]
        assert len(pairs) == len(set(pairs)), kind
        assert len(kept_pairs(kind, GROUP_NAMES)) == len(pairs)
        layer = getattr(model, kind)[0]
        for g in groups:
            for name in g.modules or ():
                assert name == "" or isinstance(getattr(layer, name), torch.nn.Module), (kind, name)
    with pytest.raises(HeptstudyError, match="not known; allowed: .*attention"):
        plan_named("x", keep={"attention", "hashing"})


def _held_after_forward(plan, config, batch):
    """Bytes a checkpointed backbone layer holds after its forward (its inputs, parameters,
    output and what its plan keeps), hashing its own bucket order."""
    holder = torch.nn.Module()
    holder.backbone = torch.nn.ModuleList([HEPTv2Layer(config.model.heptv2, 0)])
    layer = apply_plan(holder, plan).backbone[0].train()
    mask, coords = batch["mask"], hit_coordinates(batch["X"])
    x = torch.randn(*mask.shape, config.model.heptv2.embedding_dim, requires_grad=True)
    with StorageTracker() as tracker:
        out = layer(x, mask, coords, batch["layout"])
    held = tracker.live_bytes
    del out  # with it, the graph and what it keeps
    return held


@pytest.mark.parametrize("batching", ["padded", "packed"])
def test_group_bytes_are_what_an_ops_plan_holds_beyond_full(batching):
    config = _config()
    batch = example_batch(config, len(LENGTHS), LENGTHS, seed=5, batching=batching)
    sizes = op_group_bytes(config, batch, "backbone")
    assert set(sizes) == {g.name for g in GROUPS["backbone"]} and all(sizes.values())
    R, S = batch["mask"].shape
    D = config.model.heptv2.embedding_dim
    assert sizes["qkv"] == R * S * 3 * D * 4
    assert sizes["dropout"] == 2 * R * S * D  # two boolean masks
    assert sizes["mlp"] == R * S * D * 4  # the SwiGLU's output, not its hidden products
    full = _held_after_forward(FULL, config, batch)
    for keep in ({"order"}, KEEP, set(sizes) - {"mlp"}, set(sizes)):
        held = _held_after_forward(plan_named("k", keep=keep), config, batch)
        assert held - full == sum(sizes[g] for g in keep), sorted(keep)


def test_decoder_group_bytes_count_each_kept_output():
    config = _config("model.decoder.dropout=0.2")
    batch = example_batch(config, len(LENGTHS), LENGTHS, seed=5)
    sizes = op_group_bytes(config, batch, "decoder")
    E, Q, D = len(LENGTHS), config.model.decoder.num_queries, config.model.heptv2.embedding_dim
    assert sizes["cross_q"] == sizes["cross_out"] == E * Q * D * 4
    assert sizes["cross_kv"] == batch["mask"].numel() * 2 * D * 4
    assert sizes["dropout"] == 3 * E * Q * D  # three boolean masks


def test_fake_step_estimates_an_ops_plan_between_full_and_off():
    """The estimator's fake step runs the dispatcher ops under an ``ops`` plan; keeping a few
    groups costs more than ``full`` and less than ``off``."""
    auto = _config("model.heptv2.activation_checkpointing=auto")
    batch = example_batch(auto, len(LENGTHS), LENGTHS, seed=5)
    peaks = {
        name: estimate_step(auto, batch, plan=plan, target="cuda").peak_allocated_bytes
        for name, plan in [("off", OFF), ("full", FULL), ("ops", plan_named("k", keep=KEEP))]
    }
    assert peaks["full"] < peaks["ops"] < peaks["off"], peaks
