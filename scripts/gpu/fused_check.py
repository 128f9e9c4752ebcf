"""GPU check of the fused (flex_attention) attention, for scripts/gpu/run.sh.

1. ``kernel``: the compiled kernel on 12 new sorted lengths (6,000-7,500 rows, as in the H200
   recompile-limit diagnosis), bf16, forward + backward, with each shape policy (``dynamic`` and
   ``ladder``): compiles, seconds and peak allocated per call, and any FusedAttentionError.
2. ``parity``: the full model in fp32 on two events of 3,000 and 2,100 hits, fused (each policy)
   against plain: max |output difference| and max relative L2 of the gradients.
3. ``backbone``: ``heptstudy bench backbone`` at 10,000 hits (fp32, as the H200 evidence) with
   plain, fused/dynamic and fused/ladder attention: median time and peak allocated.

Every section is written to the JSON file as soon as it ends; a section that fails records its
error and the others still run. ``--device cpu --scale 0.05`` checks the plumbing on a CPU
(where the fused path has no backward, so the fused sections record that error).

    python3 scripts/gpu/fused_check.py OUT.json [--device cuda] [--scale 1]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback

import torch

from heptstudy.atomic import atomic_write_text
from heptstudy.config import load_config
from heptstudy.measure.backbone import run_backbone_bench
from heptstudy.model import build_model, example_batch, flex_kernel
from heptstudy.model.fused_attention import bucket_block_mask

DEV = torch.device("cuda")
SCALE = 1.0  # lengths and hits are multiplied by it (a CPU plumbing check uses a small one)
MIB = 2**20


def _n(value: int) -> int:
    return max(1, int(value * SCALE))


def _sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def kernel(policy: str) -> dict:
    """12 new lengths through the compiled kernel, forward and backward, bf16."""
    flex_kernel.set_shape_policy(policy)
    flex_kernel.reset_counts()
    rows = []
    for i in range(12):
        sorted_len = math.ceil(_n(6000 + 128 * i) / 100) * 100  # block_size 100, like the model
        length = flex_kernel.kernel_length(sorted_len)
        gen = torch.Generator(device=DEV.type).manual_seed(i)
        q, k, v = (
            torch.randn(
                2 * 3, 8, length, 16, device=DEV, generator=gen, dtype=torch.bfloat16
            ).requires_grad_(True)
            for _ in range(3)
        )
        valid = (torch.arange(length, device=DEV) < sorted_len - 50).expand(6, -1)
        mask = bucket_block_mask(valid, 100)
        _sync()
        if DEV.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out, lse = flex_kernel.flex_attention_lse(q, k, v, mask)
        (out.float().square().mean() + lse[torch.isfinite(lse)].mean()).backward()
        _sync()
        rows.append(
            {
                "sorted_len": sorted_len,
                "kernel_len": length,
                "seconds": time.perf_counter() - t0,
                "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB
                if DEV.type == "cuda"
                else None,
                "compiles_so_far": flex_kernel.attention_status()["fused_compiles"],
            }
        )
        print(policy, rows[-1], flush=True)
    return {"policy": policy, "calls": rows, "status": flex_kernel.attention_status()}


def _run_model(backend: str, lengths, policy: str | None):
    if policy:
        flex_kernel.set_shape_policy(policy)
    cfg = load_config(
        overrides=[f"model.heptv2.attention_backend={backend}", "model.heptv2.dropout=0.0"]
    )
    torch.manual_seed(1)
    model = build_model(cfg).to(DEV).train()
    batch = {k: v.to(DEV) for k, v in example_batch(cfg, len(lengths), lengths, seed=0).items()}
    out = model(batch)
    floats = [v for v in out.values() if torch.is_tensor(v) and v.is_floating_point()]
    sum((v.float() ** 2).mean() for v in floats).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items() if torch.is_tensor(v)}, grads


def parity(policy: str) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lengths = [_n(3000), _n(2100)]
    out_p, grad_p = _run_model("plain", lengths, None)
    out_f, grad_f = _run_model("fused", lengths, policy)
    worst_out = max(
        (float((out_f[k].float() - out_p[k].float()).abs().max()), k)
        for k in out_p
        if out_p[k].is_floating_point()
    )
    worst_grad = max(
        (float((grad_f[n] - grad_p[n]).norm() / grad_p[n].norm().clamp(min=1e-30)), n)
        for n in grad_p
    )
    return {
        "policy": policy,
        "max_abs_output_difference": worst_out,
        "max_rel_l2_gradient_difference": worst_grad,
        "gradients": [len(grad_p), len(grad_f)],
    }


def backbone(backend: str, policy: str | None) -> dict:
    if policy:
        flex_kernel.set_shape_policy(policy)
    cfg = load_config(overrides=[f"model.heptv2.attention_backend={backend}"])
    result = run_backbone_bench(cfg, _n(10000), repeats=5, device=str(DEV))
    result["shape_policy"] = policy
    result["attention_status"] = flex_kernel.attention_status(cfg)
    return result


def main(argv=None) -> int:
    global DEV, SCALE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="JSON file for the results")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", type=float, default=1.0, help="lengths and hits x this")
    args = parser.parse_args(argv)
    DEV, SCALE, path = torch.device(args.device), args.scale, args.output
    results: dict = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu",
        "scale": SCALE,
        "sections": {},
    }
    sections = [
        ("kernel_dynamic", lambda: kernel("dynamic")),
        ("kernel_ladder", lambda: kernel("ladder")),
        ("parity_dynamic", lambda: parity("dynamic")),
        ("parity_ladder", lambda: parity("ladder")),
        ("backbone_plain", lambda: backbone("plain", None)),
        ("backbone_fused_dynamic", lambda: backbone("fused", "dynamic")),
        ("backbone_fused_ladder", lambda: backbone("fused", "ladder")),
    ]
    failed = 0
    for name, fn in sections:
        t0 = time.perf_counter()
        try:
            value = {"ok": True, **fn()}
        except Exception as err:  # noqa: BLE001 - recorded, and the next section still runs
            failed += 1
            value = {
                "ok": False,
                "error": f"{type(err).__name__}: {err}"[:2000],
                "traceback": traceback.format_exc()[-4000:],
            }
            if DEV.type == "cuda":
                torch.cuda.empty_cache()
        value["wall_s"] = time.perf_counter() - t0
        results["sections"][name] = value
        print(name, "ok" if value["ok"] else value["error"][:300], f"{value['wall_s']:.1f}s")
        atomic_write_text(path, json.dumps(results, indent=2, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
