"""The memory-lean pieces of the HEPTv2 layer against plain autograd references: the sliced
bucket attention (recomputed scores in backward) and the sliced SwiGLU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from heptstudy.config import load_config
from heptstudy.model import example_batch, heptv2
from heptstudy.model.buckets import MASKED
from heptstudy.model.heptv2 import HEPTv2Layer, SwiGLU, hit_coordinates, plain_bucket_attention


def _reference_attention(q, k, v, buckets, block_size):
    """Bucket attention per round with autograd ops, rounds merged by softmax of their lse."""
    B, C, H, Sp = buckets.order.shape
    S = q.shape[1]
    outs, lses = [], []
    for c in range(C):
        out_c = torch.zeros_like(q)
        lse_c = torch.zeros(q.shape[:-1], dtype=q.dtype)
        for b in range(B):
            for h in range(H):
                idx = buckets.order[b, c, h].long()
                qs, ks, vs = q[b, idx, h], k[b, idx, h], v[b, idx, h]
                valid = buckets.valid[b]
                o_rows, l_rows = [], []
                for start in range(0, Sp, block_size):
                    blk = slice(start, start + block_size)
                    s = qs[blk] @ ks[blk].T
                    s = s.masked_fill(~valid[blk][None, :], MASKED)
                    lse = torch.logsumexp(s, dim=-1)
                    o_rows.append(torch.softmax(s, dim=-1) @ vs[blk])
                    l_rows.append(lse)
                o_sorted, l_sorted = torch.cat(o_rows), torch.cat(l_rows)
                rank = buckets.rank[b, c, h].long()
                out_c = out_c.index_put(
                    (torch.tensor([b]), torch.arange(S), torch.tensor([h])), o_sorted[rank]
                )
                lse_c = lse_c.index_put(
                    (torch.tensor([b]), torch.arange(S), torch.tensor([h])), l_sorted[rank]
                )
        outs.append(out_c)
        lses.append(lse_c)
    return heptv2.merge_rounds(torch.stack(outs, 1), torch.stack(lses, 1))


def _layer_and_inputs(tiny_overrides, lengths, block_size=16):
    cfg = load_config(overrides=tiny_overrides + [f"model.heptv2.block_size={block_size}"])
    layer = HEPTv2Layer(cfg.model.heptv2, 0)
    batch = example_batch(cfg, len(lengths), lengths, seed=3)
    buckets = layer.bucket_order(hit_coordinates(batch["X"]), batch["mask"], batch["layout"])
    return layer, batch, buckets


@pytest.mark.parametrize("block_size", [16, 12])  # 12 does not divide 48 hits: padding slots
def test_sliced_attention_matches_reference_values_and_gradients(tiny_overrides, block_size):
    layer, batch, buckets = _layer_and_inputs(tiny_overrides, [45, 20], block_size)
    B, S = batch["mask"].shape
    H, dh = layer.num_heads, layer.head_dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, S, H, dh, generator=g, dtype=torch.float64) for _ in range(3))
    d_out = torch.randn(B, S, H, dh, generator=g, dtype=torch.float64)
    d_out[~batch["mask"]] = 0  # the layer zeroes padded hits, so they never carry a gradient

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, buckets, block_size)
        out.backward(d_out)
        return out.detach(), [t.grad for t in leaves]

    got, got_grads = run(plain_bucket_attention)
    want, want_grads = run(_reference_attention)
    valid = batch["mask"]
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-10, atol=1e-10)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_sliced_attention_passes_gradcheck(tiny_overrides):
    layer, batch, buckets = _layer_and_inputs(tiny_overrides, [30, 11], block_size=8)
    B, S = batch["mask"].shape
    H, dh = layer.num_heads, 4
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(B, S, H, dh, generator=g, dtype=torch.float64).requires_grad_()
        for _ in range(3)
    )
    mask = batch["mask"][..., None, None].double()

    def f(q, k, v):
        return plain_bucket_attention(q, k, v, buckets, 8) * mask

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-6, fast_mode=True)


def test_attention_reads_strided_views_without_changing_results(tiny_overrides):
    layer, batch, buckets = _layer_and_inputs(tiny_overrides, [40, 33])
    B, S = batch["mask"].shape
    H, dh = layer.num_heads, layer.head_dim
    qkv = torch.randn(B, S, 3, H, dh, generator=torch.Generator().manual_seed(2))
    q, k, v = qkv.unbind(dim=2)
    assert not v.is_contiguous()
    a = plain_bucket_attention(q, k, v, buckets, 16)
    b = plain_bucket_attention(q.contiguous(), k.contiguous(), v.contiguous(), buckets, 16)
    assert torch.equal(a, b)


def test_bucket_tables_are_int32(tiny_overrides):
    _, _, buckets = _layer_and_inputs(tiny_overrides, [45, 20])
    assert buckets.order.dtype == torch.int32 and buckets.rank.dtype == torch.int32
    # the flat rows of the fused path still invert each other
    S = buckets.rank.shape[-1]
    t = torch.arange(2 * S * 2, dtype=torch.float32).view(2, S, 2, 1)
    B, C, H, Sp = buckets.order.shape
    sorted_t = t.reshape(-1, 1).index_select(0, buckets.sort_rows).view(B, C, H, Sp, 1)
    back = sorted_t.reshape(-1, 1).index_select(0, buckets.unsort_rows).view(B, C, S, H, 1)
    assert torch.equal(back, t[:, None].expand(B, C, S, H, 1))


def test_sliced_swiglu_matches_autograd(monkeypatch):
    monkeypatch.setattr(heptv2, "SWIGLU_SLICE_ELEMENTS", 7 * 2 * 24)  # several row slices
    torch.manual_seed(0)
    mlp = SwiGLU(16, 24).double()
    x = torch.randn(3, 11, 16, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(3, 11, 16, dtype=torch.float64)
    out = mlp(x)
    out.backward(d_out)
    got = (out.detach(), x.grad, mlp.gate_up.weight.grad, mlp.down.weight.grad)

    x2 = x.detach().clone().requires_grad_()
    w1 = mlp.gate_up.weight.detach().clone().requires_grad_()
    w2 = mlp.down.weight.detach().clone().requires_grad_()
    gate, up = F.linear(x2, w1).chunk(2, dim=-1)
    ref = F.linear(F.silu(gate) * up, w2)
    ref.backward(d_out)
    for a, b in zip(got, (ref.detach(), x2.grad, w1.grad, w2.grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_swiglu_under_bf16_autocast_runs_in_bf16_with_float32_parameter_grads():
    torch.manual_seed(0)
    mlp = SwiGLU(16, 24)
    x = torch.randn(2, 5, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mlp(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert mlp.gate_up.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    ref = F.linear(
        F.silu(F.linear(x, mlp.gate_up.weight)[..., :24])
        * F.linear(x, mlp.gate_up.weight)[..., 24:],
        mlp.down.weight,
    )
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


def _plain_sequential(lean):
    plain = torch.nn.Sequential(*[type(m)(*_args(m)) for m in lean])
    plain.load_state_dict(lean.state_dict())
    return plain


def _args(m):
    if isinstance(m, torch.nn.Linear):
        return (m.in_features, m.out_features)
    if isinstance(m, torch.nn.LayerNorm):
        return (m.normalized_shape,)
    return ()


@pytest.mark.parametrize("autocast", [False, True])
def test_lean_mlp_matches_the_layers_one_by_one(autocast):
    from heptstudy.model.encoding import LeanMLP

    torch.manual_seed(0)
    lean = LeanMLP(7, 32, 5)
    plain = _plain_sequential(lean)
    assert list(plain.state_dict()) == list(lean.state_dict())
    x = torch.randn(13, 7)
    d_out = torch.randn(13, 5)

    def run(module):
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = module(xi)
        out.backward(d_out.to(out.dtype))
        return [out.detach(), xi.grad] + [p.grad for p in module.parameters()]

    got, want = run(lean), run(plain)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(
            a, b, rtol=1e-5 if not autocast else 2e-2, atol=1e-6 if not autocast else 2e-2
        )


def test_lean_mlp_with_frozen_parameters_needs_no_backward():
    from heptstudy.model.encoding import LeanMLP

    lean = LeanMLP(4, 8, 3).requires_grad_(False)
    out = lean(torch.randn(2, 4))
    assert not out.requires_grad


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_rms_norm_matches_functional(dtype):
    from heptstudy.model.heptv2 import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(12).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 12, dtype=torch.float64).to(dtype)
    d_y = torch.randn(3, 5, 12, dtype=torch.float64)

    def run(fn, weight):
        xi = x.clone().requires_grad_()
        y = fn(xi, weight)
        y.backward(d_y.to(y.dtype))
        return y.detach(), xi.grad, weight.grad

    got = run(lambda xi, w: norm(xi), norm.weight)
    w = norm.weight.detach().clone().requires_grad_()
    want = run(lambda xi, w: F.rms_norm(xi, (12,), w, norm.eps), w)
    tol = {} if dtype == torch.float64 else {"rtol": 2e-2, "atol": 2e-2}
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, **tol)


def test_layer_keeps_no_bucket_scores_for_backward(tiny_overrides):
    """What a layer saves for backward has no tensor of bucket scores or probabilities
    ([..., block_size, block_size]): those are recomputed slice by slice."""
    layer, batch, buckets = _layer_and_inputs(tiny_overrides, [45, 20], block_size=24)
    mask, coords = batch["mask"], hit_coordinates(batch["X"])
    x = torch.randn(*mask.shape, layer.num_heads * layer.head_dim, requires_grad=True)
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: shapes.append(t.shape) or t, lambda t: t
    ):
        layer(x, mask, coords, batch["layout"], buckets)
    assert shapes
    assert not [s for s in shapes if len(s) >= 2 and s[-1] == s[-2] == 24]


def test_checkpointed_layer_releases_its_bucket_order_in_its_backward(tiny_overrides):
    import weakref

    from heptstudy.model.checkpoint_plan import FULL, apply_plan

    cfg = load_config(overrides=tiny_overrides + ["model.heptv2.activation_checkpointing=true"])
    holder = torch.nn.Module()
    holder.backbone = torch.nn.ModuleList([HEPTv2Layer(cfg.model.heptv2, 0)])
    layer = apply_plan(holder, FULL).backbone[0].train()
    batch = example_batch(cfg, 2, [40, 30], seed=1)
    mask, coords = batch["mask"], hit_coordinates(batch["X"])
    x = torch.randn(*mask.shape, cfg.model.heptv2.embedding_dim, requires_grad=True)
    buckets = layer.bucket_order(coords, mask, batch["layout"])
    order = weakref.ref(buckets.order)
    out = layer(x, mask, coords, batch["layout"], buckets)
    del buckets
    assert order() is not None  # the checkpoint keeps it for the recomputation
    out.sum().backward()
    assert order() is None  # gone with the layer's backward, while its output still lives
