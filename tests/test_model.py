import pytest
import torch
import torch.utils.checkpoint as tuc

from heptstudy.config import load_config
from heptstudy.data.batching import map_tensors
from heptstudy.data.layout import EventLayout
from heptstudy.meters.memory import StorageTracker
from heptstudy.model import build_model, example_batch
from heptstudy.model.checkpoint_plan import checkpoint_slots, plan_of, unwrapped_name
from heptstudy.model.heptv2 import hit_coordinates

LENGTHS = [70, 41, 23]  # unequal events, padded to 80 hits


#: Every checkpointing policy must keep the same guarantees.
POLICIES = ["full", "selective", "every2", "every3", "layers2"]
POLICY_IDS = POLICIES


def _build(overrides, checkpointing, seed=0):
    cfg = load_config(
        overrides=overrides + [f"model.heptv2.activation_checkpointing={checkpointing}"]
    )
    torch.manual_seed(seed)
    return build_model(cfg), cfg


def _train_pass(model, batch, rng_seed=123):
    """Forward and backward with dropout active; returns outputs, grads and the RNG state after."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(rng_seed)
    out = model(batch)
    loss = sum(
        (v.float() * torch.linspace(0.5, 1.5, v.numel()).view_as(v)).sum() for v in out.values()
    )
    loss.backward()
    grads = {
        unwrapped_name(n): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }
    return {k: v.detach() for k, v in out.items()}, grads, torch.get_rng_state()


@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
@pytest.mark.parametrize("freeze", [False, True])
def test_checkpointing_changes_no_output_gradient_or_rng_state(tiny_overrides, freeze, policy):
    overrides = tiny_overrides + [
        "model.heptv2.dropout=0.3",
        f"model.freeze.input_encoder={freeze}",
    ]
    base, cfg = _build(overrides, False)
    ckpt, _ = _build(overrides, policy)
    batch = example_batch(cfg, 3, LENGTHS, seed=5)
    assert batch["mask"].shape[1] == 80 and not batch["mask"][2, 23:].any()

    out_a, grads_a, rng_a = _train_pass(base, batch)
    out_b, grads_b, rng_b = _train_pass(ckpt, batch)

    assert set(out_a) == set(out_b) and any(k.startswith("aux") for k in out_a)
    for k in out_a:
        assert torch.equal(out_a[k], out_b[k]), k
    assert set(grads_a) == set(grads_b)
    if freeze:
        assert not any(n.startswith("input_encoder") for n in grads_a)
    for n in grads_a:
        assert torch.equal(grads_a[n], grads_b[n]), n
    assert torch.equal(rng_a, rng_b)
    # Dropout really was active: a different RNG seed changes the outputs.
    out_c, _, _ = _train_pass(base, batch, rng_seed=999)
    assert not torch.equal(out_a["class_logits"], out_c["class_logits"])


@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
def test_state_dict_loads_strictly_both_ways(tiny_overrides, policy):
    base, _ = _build(tiny_overrides, False)
    ckpt, _ = _build(tiny_overrides, policy, seed=1)
    assert list(base.state_dict()) == list(ckpt.state_dict())
    assert any("hash_directions" in k for k in base.state_dict())
    assert any("region_shape" in k for k in base.state_dict())
    ckpt.load_state_dict(base.state_dict(), strict=True)
    base.load_state_dict(ckpt.state_dict(), strict=True)
    for k, v in base.state_dict().items():
        assert torch.equal(v, ckpt.state_dict()[k])


class _CountingCheckpoint:
    def __init__(self, monkeypatch):
        self.calls = 0
        real = tuc.checkpoint

        def counting(*args, **kwargs):
            self.calls += 1
            assert kwargs["use_reentrant"] is False and kwargs["preserve_rng_state"] is True
            return real(*args, **kwargs)

        monkeypatch.setattr(tuc, "checkpoint", counting)


@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
def test_checkpoint_used_only_when_training_with_grad(tiny_overrides, monkeypatch, policy):
    counter = _CountingCheckpoint(monkeypatch)
    model, cfg = _build(tiny_overrides, policy)
    batch = example_batch(cfg, 2, [40, 30], seed=1)
    model.train()
    model(batch)
    plan = plan_of(cfg.model.heptv2)
    # the plan's layers of the backbone and of the decoder
    expected = sum(plan.checkpoints(slot) for slot in checkpoint_slots(model))
    assert counter.calls == expected
    counter.calls = 0
    with torch.no_grad():
        model(batch)
    assert counter.calls == 0
    model.eval()
    model(batch)
    assert counter.calls == 0
    off, _ = _build(tiny_overrides, False)
    off.train()
    off(batch)
    assert counter.calls == 0


def test_events_do_not_see_each_other_and_padding_is_inert(tiny_overrides):
    model, cfg = _build(tiny_overrides, False)
    model.eval()
    batch = example_batch(cfg, 2, [60, 45], seed=2)
    with torch.no_grad():
        out = model(batch)
        changed = map_tensors(batch, torch.clone)
        changed["X"][1, :45, 2] += 0.7  # move event 2's hits in eta
        changed["X"][1, :45, 5] *= 3.0
        out2 = model(changed)
        for k in out:
            assert torch.equal(out[k][0], out2[k][0]), k
        assert not torch.equal(out["class_logits"][1], out2["class_logits"][1])

        # 48 more padded hits on every event: valid outputs unchanged.
        padded = map_tensors(batch, torch.clone)
        S = batch["mask"].shape[1]
        for key in ("X", "ytarget", "neighbourhood", "mask"):
            t = padded[key]
            pad = torch.zeros(t.shape[0], 48, *t.shape[2:], dtype=t.dtype)
            padded[key] = torch.cat([t, pad], dim=1)
        padded["layout"] = EventLayout.padded([60, 45], S + 48)
        out3 = model(padded)
        for k in out:
            got = out3[k][:, :S] if k == "hit_embed" else out3[k]
            torch.testing.assert_close(got, out[k], rtol=1e-5, atol=1e-5)


def test_padded_positions_of_backbone_are_zero(tiny_overrides):
    model, cfg = _build(tiny_overrides, False)
    batch = example_batch(cfg, 2, [50, 20], seed=3)
    mask = batch["mask"]
    coords = hit_coordinates(batch["X"])
    layer = model.backbone[0]
    x = torch.randn(*mask.shape, cfg.model.heptv2.embedding_dim)
    y = layer(x, mask, coords, batch["layout"])
    assert torch.all(y[~mask] == 0)


def test_bucket_order_sorts_padding_last_and_stays_within_event(tiny_overrides):
    model, cfg = _build(tiny_overrides, False)
    batch = example_batch(cfg, 2, [50, 20], seed=3)
    mask = batch["mask"]
    order = model.backbone[0].bucket_order(hit_coordinates(batch["X"]), mask, batch["layout"])
    n = mask.sum(1)
    for b in range(2):
        first = order.order[b, ..., : n[b]]
        assert mask[b][first].all()  # the first n_valid sorted positions are the valid hits
        assert order.padded_len % cfg.model.heptv2.block_size == 0


def test_hashing_stays_float32_under_bf16_autocast(tiny_overrides):
    model, cfg = _build(tiny_overrides, False)
    batch = example_batch(cfg, 2, [50, 20], seed=4)
    coords, mask = hit_coordinates(batch["X"]), batch["mask"]
    layer = model.backbone[1]
    ref = layer.bucket_order(coords, mask, batch["layout"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer.bucket_order(coords, mask, batch["layout"])
    assert torch.equal(ref.order, got.order)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_fused_flex_attention_path_matches_plain(tiny_overrides):
    plain, cfg = _build(tiny_overrides + ["model.heptv2.attention_backend=plain"], False)
    fused, _ = _build(tiny_overrides + ["model.heptv2.attention_backend=fused"], False)
    batch = example_batch(cfg, 2, [50, 20], seed=6)
    plain.eval(), fused.eval()
    with torch.no_grad():
        a, b = plain(batch), fused(batch)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-4)


def test_phi_read_through_atan2_ignores_common_scale(tiny_overrides):
    model, cfg = _build(tiny_overrides, False)
    model.eval()
    batch = example_batch(cfg, 1, [50], seed=7)
    scaled = map_tensors(batch, torch.clone)
    scaled["X"][..., 3:5] *= 1.7
    with torch.no_grad():
        a, b = model(batch), model(scaled)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5)


def test_track_cluster_variant_builds_and_runs(tiny_overrides):
    cfg = load_config(
        overrides=tiny_overrides
        + ["model.variant=track_cluster_mlpf", "data.dataset=cld_edm_ttbar_pf:3.2.1"]
    )
    model = build_model(cfg)
    batch = example_batch(cfg, 2, [30, 17], seed=1)
    out = model(batch)
    assert out["class_logits"].shape == (2, 32, 6) and out["momentum"].shape == (2, 32, 5)


@pytest.mark.parametrize("seq_len,block_size", [(1000, 100), (640, 48), (300, 128), (96, 100)])
def test_bucket_block_mask_lists_every_block_a_bucket_needs(seq_len, block_size):
    """The fused path's sparse block mask must cover every allowed (query, key) pair; the kernel
    skips unlisted blocks, so a missing one would silently drop attention."""
    from heptstudy.model.fused_attention import FLEX_BLOCK, bucket_block_mask

    valid = torch.arange(seq_len) < torch.tensor([[seq_len], [seq_len - 37]])
    bm = bucket_block_mask(valid, block_size)
    listed = bm.to_dense()[0, 0].bool()  # [q blocks, kv blocks]
    idx = torch.arange(seq_len)
    allowed = idx[:, None] // block_size == idx[None, :] // block_size
    qb, kb = torch.nonzero(allowed, as_tuple=True)
    assert listed[qb // FLEX_BLOCK, kb // FLEX_BLOCK].all()
    # ... and lists no more than the few blocks the buckets touch.
    assert int(listed.sum(1).max()) <= 2 + FLEX_BLOCK // block_size + 1


def _bytes_held_after_forward(overrides, checkpointing):
    """Bytes of the storages a backbone layer's forward touched that are still alive after it
    (its inputs, parameters and output, and what it keeps for backward): the layer's inputs and
    output are the same under every policy, so differences are what each policy saves."""
    model, cfg = _build(overrides, checkpointing)
    layer = model.backbone[0].train()
    batch = example_batch(cfg, 2, [40, 30], seed=1)
    mask, coords = batch["mask"], hit_coordinates(batch["X"])
    x = torch.randn(*mask.shape, cfg.model.heptv2.embedding_dim, requires_grad=True)
    buckets = layer.bucket_order(coords, mask, batch["layout"])
    with StorageTracker() as tracker:
        out = layer(x, mask, coords, batch["layout"], buckets)
    held = tracker.live_bytes
    products = sum(
        mask.numel() * linear.out_features * out.element_size()
        for projection in layer.dense_projections()
        for linear in projection.modules()
        if isinstance(linear, torch.nn.Linear)
    )
    return held, products


def test_selective_policy_saves_the_dense_projections_products_by_module_not_by_width(
    tiny_overrides,
):
    """``selective`` keeps one row per hit of every linear map in ``dense_projections()`` and
    nothing else beyond ``full``. With embedding_dim equal to the positional MLP's hidden width,
    a policy that recognised the projections by width would also keep the positional MLP's two
    products."""
    from heptstudy.model.heptv2 import POSITIONAL_HIDDEN

    overrides = [o for o in tiny_overrides if not o.startswith("model.heptv2.embedding_dim")]
    overrides += [f"model.heptv2.embedding_dim={POSITIONAL_HIDDEN}"]
    off, _ = _bytes_held_after_forward(overrides, False)
    full, _ = _bytes_held_after_forward(overrides, "full")
    selective, products = _bytes_held_after_forward(overrides, "selective")
    assert full < selective < off
    assert selective - full == products
