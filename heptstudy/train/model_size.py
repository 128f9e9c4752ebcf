"""Will the model itself fit? Counted on the meta device, so a huge configuration is refused
instead of ending in the allocator with nothing said."""

from __future__ import annotations

import torch

from heptstudy.config import Config
from heptstudy.errors import HeptstudyError
from heptstudy.model import build_model
from heptstudy.units import GIB, MIB, host_memory_available

#: weights, gradients and the optimizer's two moments, each one copy of the parameters
COPIES = 4


class ModelTooLarge(HeptstudyError):
    pass


def check_model_fits(config: Config, device: torch.device | str) -> int:
    """Refuse a model whose training state exceeds ``device``'s memory; returns its bytes."""
    device = torch.device(device)
    with torch.device("meta"):
        model = build_model(config)
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    nbytes = sum(p.numel() * p.element_size() for p in params)
    nbytes += sum(b.numel() * b.element_size() for b in model.buffers())
    need = COPIES * nbytes
    if device.type == "cuda":
        free, where = int(torch.cuda.mem_get_info(device)[0]), f"{device} (free device memory)"
    else:
        free, where = host_memory_available(), "this host (MemAvailable)"
    if free is not None and need > free:
        h = config.model.heptv2
        raise ModelTooLarge(
            f"the configured model has {count:,} parameters ({nbytes / MIB:,.0f} MiB); its "
            f"weights, gradients and LAMB's two moments need about {need / GIB:,.1f} GiB, but "
            f"{where} has {free / GIB:,.1f} GiB available, so nothing was built or run. Lower "
            f"the model size (now model.heptv2.embedding_dim={h.embedding_dim}, "
            f"width={h.width}, num_convs={h.num_convs}) or run where more memory is free"
        )
    return nbytes
