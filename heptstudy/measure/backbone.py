"""`heptstudy bench backbone`: forward and backward of the HEPTv2 backbone alone on one event of
N random hits: wall time and peak live tensor bytes, the figures its speed work is judged by."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from heptstudy.atomic import Output
from heptstudy.config import Config
from heptstudy.data.batching import to_device
from heptstudy.errors import ConfigError
from heptstudy.meters.memory import make_meter
from heptstudy.meters.timing import StepTimer
from heptstudy.model import example_batch
from heptstudy.model.checkpoint_plan import apply_plan, plan_of
from heptstudy.model.heptv2 import HEPTv2Layer, hit_coordinates
from heptstudy.units import refuse_above_memory

#: ``--output`` replaces only an earlier backbone result (the committed ones carry no schema
#: field; this key is theirs alone).
RESULT_FILE = Output("heptstudy backbone result", ".json", b'"median_s": ')


def check_backbone_request(
    hits: Any, repeats: Any, device: Any, threads: Any = None, output: Any = None
) -> torch.device:
    """Refuse what cannot be measured, or whose result could not be written, before anything
    runs; returns the device."""
    wanted = {"--hits": 10000, "--repeats": 3, "--threads": 2}
    given = {"--hits": hits, "--repeats": repeats, "--threads": 1 if threads is None else threads}
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{name} {value!r}: the backbone bench needs a whole number of at least 1 "
                f"here; give for example {name} {wanted[name]}"
            )
    if output is not None:
        from heptstudy.measure.bench import check_writable

        check_writable(Path(output), RESULT_FILE)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"--device {device!r} is not a device name; give cpu, cuda or cuda:N"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"--device {device!r}: this PyTorch ({torch.__version__}) sees no CUDA or ROCm device; "
            "run on a GPU machine or give --device cpu"
        )
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {device!r}: there are {torch.cuda.device_count()} devices "
            f"(cuda:0..cuda:{torch.cuda.device_count() - 1}); give one of them"
        )
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: the backbone bench runs on cpu or cuda only")
    return dev


def run_backbone_bench(
    config: Config, hits: int, repeats: int = 3, device: str = "cpu", seed: int = 0
) -> dict[str, Any]:
    dev = check_backbone_request(hits, repeats, device)
    cfg = config.model.heptv2
    # a lower bound: the input, its gradient and one layer's SwiGLU hidden state, in float32
    refuse_above_memory(
        4 * hits * (3 * cfg.embedding_dim + 3 * cfg.width),
        f"the backbone bench on --hits {hits:,} (embedding {cfg.embedding_dim}, width {cfg.width})",
        "Give fewer --hits",
    )
    torch.manual_seed(seed)
    holder = torch.nn.Module()
    holder.backbone = torch.nn.ModuleList(HEPTv2Layer(cfg, i) for i in range(cfg.num_convs))
    layers = apply_plan(holder, plan_of(config)).backbone.to(dev).train()
    batch = to_device(example_batch(config, 1, hits, seed=seed), dev)
    mask, coords, layout = batch["mask"], hit_coordinates(batch["X"]), batch["layout"]
    x = torch.randn(*mask.shape, cfg.embedding_dim, device=dev, requires_grad=True)
    grad = torch.randn_like(x)

    def step():
        orders = [layer.bucket_order(coords, mask, layout) for layer in layers]
        out = x
        for layer, order in zip(layers, orders, strict=True):
            out = layer(out, mask, coords, layout, order)
        out.backward(grad)
        x.grad = None
        layers.zero_grad(set_to_none=True)

    step()  # warm-up: allocator growth, lazy initialisation
    timer, times = StepTimer(dev), []
    for _ in range(repeats):
        with timer.step():
            step()
        times.append(timer.seconds)
    meter = make_meter(dev)
    meter.start_step([x, grad, batch], model=layers)
    step()
    mem = meter.stop_step()
    return {
        "hits": hits,
        "padded_hits": int(mask.shape[1]),
        "layers": cfg.num_convs,
        "embedding_dim": cfg.embedding_dim,
        "heads": cfg.num_heads,
        "block_size": cfg.block_size,
        "n_hashes": cfg.n_hashes,
        "activation_checkpointing": cfg.activation_checkpointing,
        "attention_backend": cfg.attention_backend,
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "times_s": times,
        "median_s": statistics.median(times),
        "peak_allocated_mib": mem.peak_allocated_mib,
        "peak_definition": mem.allocated_definition,
    }


def describe_backbone(r: dict[str, Any]) -> str:
    plan = r["activation_checkpointing"]
    ckpt = "no checkpointing" if plan == "off" else f"checkpointing {plan}"
    return (
        f"HEPTv2 backbone, {r['layers']} layers (embedding {r['embedding_dim']}, {r['heads']} heads, "
        f"block {r['block_size']}, {r['n_hashes']} hashes), {ckpt}, {r['attention_backend']} attention\n"
        f"  {r['hits']:,} hits ({r['padded_hits']:,} padded), {r['device']}, {r['threads']} threads, torch {r['torch']}\n"
        f"  forward + backward: median {r['median_s']:.2f} s over {len(r['times_s'])} runs "
        f"({', '.join(f'{t:.2f}' for t in r['times_s'])} s)\n"
        f"  peak live tensors: {r['peak_allocated_mib']:,.0f} MiB"
    )
