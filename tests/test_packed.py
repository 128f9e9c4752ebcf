"""Packed batches: the same events as one stream of hits give every event the outputs, losses
and gradients of the padded batch, and hold no slot of another event's length.

Tolerance: outputs and losses are compared exactly; gradients of parameters (sums over every
slot of the batch) may differ by float32 reassociation, relative L2 at most ``GRAD_RTOL``.
Dropout is off: its masks are drawn per slot, so batches of different slot counts draw
different masks by design."""

from __future__ import annotations

import pytest
import torch

from heptstudy.config import load_config
from heptstudy.errors import ConfigError
from heptstudy.model import example_batch
from heptstudy.model.hit_model import event_hits
from heptstudy.train.step import fresh_state, run_step

GRAD_RTOL = 1e-5
#: one event exactly a multiple of the block, one shorter than a block, one of several
LENGTHS = [48, 9, 70, 33]


def _config(tiny_overrides, checkpointing="false", extra=()):
    return load_config(
        overrides=tiny_overrides
        + [
            "model.heptv2.dropout=0.0",
            "model.decoder.dropout=0.0",
            f"model.heptv2.activation_checkpointing={checkpointing}",
            *extra,
        ]
    )


def _step(cfg, batching):
    model, _, _ = fresh_state(cfg, torch.device("cpu"))
    batch = example_batch(cfg, len(LENGTHS), LENGTHS, seed=11, batching=batching)
    result = run_step(model, batch, None, None, cfg, None, keep_outputs=True)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return batch, result, grads


def _per_event_hits(outputs, batch):
    return [event_hits(outputs["hit_embed"], span) for span in batch["layout"].spans]


@pytest.mark.parametrize("checkpointing", ["false", "true"])
def test_packed_and_padded_parity_plain_attention(tiny_overrides, checkpointing):
    cfg = _config(tiny_overrides, checkpointing)
    padded, a, grads_a = _step(cfg, "padded")
    packed, b, grads_b = _step(cfg, "packed")
    assert packed["X"].shape[0] == 1 and padded["X"].shape[0] == len(LENGTHS)

    for key, value in a.outputs.items():
        if key != "hit_embed":  # [E, Q, ...]: one row per event in both layouts
            assert torch.equal(value, b.outputs[key]), key
    for x, y in zip(
        _per_event_hits(a.outputs, padded), _per_event_hits(b.outputs, packed), strict=True
    ):
        assert torch.equal(x, y)
    for key, value in a.losses.items():
        assert torch.equal(value, b.losses[key]), key

    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 50
    worst = max(
        float((grads_a[n] - grads_b[n]).norm() / grads_a[n].norm().clamp(min=1e-30))
        for n in grads_a
    )
    print(f"largest relative L2 difference of a gradient: {worst:.2e}")
    assert worst <= GRAD_RTOL, worst


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_packed_and_padded_parity_fused_attention_forward(tiny_overrides):
    """The fused (flex_attention) path runs its forward on a CPU: per-event outputs equal."""
    cfg = _config(tiny_overrides, extra=["model.heptv2.attention_backend=fused"])
    model, _, _ = fresh_state(cfg, torch.device("cpu"))
    model.eval()
    out = {}
    with torch.no_grad():
        for batching in ("padded", "packed"):
            batch = example_batch(cfg, len(LENGTHS), LENGTHS, seed=11, batching=batching)
            out[batching] = (model(batch), batch)
    (a, pa), (b, pb) = out["padded"], out["packed"]
    for key in a:
        if key != "hit_embed":
            torch.testing.assert_close(a[key], b[key], rtol=GRAD_RTOL, atol=GRAD_RTOL)
    for x, y in zip(_per_event_hits(a, pa), _per_event_hits(b, pb), strict=True):
        torch.testing.assert_close(x, y, rtol=GRAD_RTOL, atol=GRAD_RTOL)


def test_packed_batch_holds_each_event_rounded_on_its_own(tiny_config):
    padded = example_batch(tiny_config, len(LENGTHS), LENGTHS, batching="padded")
    packed = example_batch(tiny_config, len(LENGTHS), LENGTHS, batching="packed")
    multiple = tiny_config.data.pad_to_multiple
    rounded = [max(-(-n // multiple) * multiple, multiple) for n in LENGTHS]
    assert packed["X"].shape[:2] == (1, sum(rounded))
    assert padded["X"].shape[:2] == (len(LENGTHS), max(rounded))
    assert int(packed["mask"].sum()) == int(padded["mask"].sum()) == sum(LENGTHS)
    spans = packed["layout"].spans
    assert [s.start for s in spans] == [sum(rounded[:i]) for i in range(len(LENGTHS))]


def test_packed_buckets_never_hold_two_events(tiny_config):
    from heptstudy.model import build_model
    from heptstudy.model.heptv2 import hit_coordinates

    model = build_model(tiny_config)
    batch = example_batch(tiny_config, len(LENGTHS), LENGTHS, seed=3, batching="packed")
    layout = batch["layout"]
    buckets = model.backbone[0].bucket_order(hit_coordinates(batch["X"]), batch["mask"], layout)
    event = layout.slot_event("cpu")[0]
    block = tiny_config.model.heptv2.block_size
    owners = event[buckets.order[0].long()].view(*buckets.order.shape[1:3], -1, block)
    assert (owners == owners[..., :1]).all()  # every bucket reads one event's slots
    # each real hit sits in a valid position, and each valid position holds a real hit
    valid_slots = batch["mask"][0][buckets.order[0].long()]
    assert torch.equal(valid_slots, buckets.valid[0].expand_as(valid_slots))


def test_packed_batching_refused_for_the_track_cluster_model(tiny_overrides):
    with pytest.raises(ConfigError, match="data.batching=packed"):
        load_config(
            overrides=tiny_overrides
            + [
                "model.variant=track_cluster_mlpf",
                "data.dataset=cld_edm_ttbar_pf:3.2.1",
                "data.batching=packed",
            ]
        )


def test_unknown_batching_is_refused(tiny_overrides):
    with pytest.raises(ConfigError, match="data.batching"):
        load_config(overrides=tiny_overrides + ["data.batching=stacked"])
