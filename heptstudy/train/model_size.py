"""Will the model itself fit? Sized on the meta device from one layer of each stack, so a huge
configuration (a width, or a layer count) is refused before anything is allocated, instead of
ending in the allocator or the kernel's OOM killer with nothing said."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from heptstudy.config import HIT_VARIANT, TRACK_CLUSTER_VARIANT, Config
from heptstudy.errors import HeptstudyError
from heptstudy.model.hit_model import HitModel
from heptstudy.model.track_cluster import TrackClusterModel
from heptstudy.units import GIB, MIB, host_memory_available

#: weights, gradients and the optimizer's two moments, each one copy of the parameters
COPIES = 4

MODELS = {HIT_VARIANT: HitModel, TRACK_CLUSTER_VARIANT: TrackClusterModel}

#: The settings under ``model.`` that size each variant's model; a refusal names the one whose
#: default would shrink the model most.
SIZE_SETTINGS = {
    HIT_VARIANT: (
        "heptv2.embedding_dim",
        "heptv2.width",
        "heptv2.num_convs",
        "heptv2.mlp_ratio",
        "heptv2.n_hashes",
        "decoder.num_layers",
        "decoder.num_queries",
    ),
    TRACK_CLUSTER_VARIANT: (
        "track_cluster.embedding_dim",
        "track_cluster.width",
        "track_cluster.num_layers",
    ),
}


#: Each layer stack of the models (a top-level ``ModuleList``) and the setting counting its
#: layers: the size check builds one layer of each and counts the rest.
STACKS = {
    "backbone": "heptv2.num_convs",
    "decoder": "decoder.num_layers",
    "layers": "track_cluster.num_layers",
}


class ModelTooLarge(HeptstudyError):
    pass


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    nbytes: int  # parameters and buffers


def _one_layer_each(config: Config) -> Config:
    """``config`` with a single layer in every stack: the layers of a stack are alike."""
    for key in STACKS.values():
        config = _with(config, key, 1)
    return config


def _meta_model(config: Config) -> nn.Module | None:
    """The model of ``config`` on the meta device (no storage), None where one of its tensors
    would exceed PyTorch's 64-bit sizes."""
    try:
        with torch.device("meta"):
            return MODELS[config.model.variant](config)
    except OverflowError:
        return None
    except (RuntimeError, TypeError) as err:
        # PyTorch says "Overflow when unpacking long long" or "Storage size ... overflowed"
        if "overflow" in str(err).lower():
            return None
        raise


def model_size(config: Config) -> ModelSize | None:
    """Parameters and bytes of ``config``'s model, without allocating them (None: a tensor of
    it would exceed PyTorch's 64-bit sizes). Built with one layer per stack, then counted."""
    model = _meta_model(_one_layer_each(config))
    if model is None:
        return None
    parameters = nbytes = 0
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        stack = STACKS.get(name.split(".")[0])
        copies = 1 if stack is None else _setting(config, stack)
        if isinstance(tensor, nn.Parameter):
            parameters += copies * tensor.numel()
        nbytes += copies * tensor.numel() * tensor.element_size()
    return ModelSize(parameters, nbytes)


def check_model_fits(config: Config, device: torch.device | str) -> int:
    """Refuse a model whose training state exceeds ``device``'s memory, before anything of it
    is allocated; returns its bytes."""
    device = torch.device(device)
    size = model_size(config)
    if size is None:
        raise ModelTooLarge(
            f"the configured model ({config.model.variant}) would hold a tensor of more than "
            f"2**63 elements, beyond what PyTorch can size, so nothing was built or run. "
            f"{_what_to_lower(config)}"
        )
    need = COPIES * size.nbytes
    if device.type == "cuda":
        free, where = int(torch.cuda.mem_get_info(device)[0]), f"{device} (free device memory)"
    else:
        free, where = host_memory_available(), "this host (MemAvailable)"
    if free is not None and need > free:
        raise ModelTooLarge(
            f"the configured model ({config.model.variant}) has {size.parameters:,} parameters "
            f"({size.nbytes / MIB:,.0f} MiB); its weights, gradients and LAMB's two moments "
            f"need about {need / GIB:,.1f} GiB, but {where} has {free / GIB:,.1f} GiB "
            f"available, so nothing was built or run. {_what_to_lower(config)}"
        )
    return size.nbytes


def _what_to_lower(config: Config) -> str:
    """Advice naming the size setting whose default shrinks the model most, else them all."""
    best = None
    for key in SIZE_SETTINGS[config.model.variant]:
        value, default = _setting(config, key), _setting(Config(), key)
        if value == default:
            continue
        size = model_size(_with(config, key, default))
        nbytes = float("inf") if size is None else size.nbytes
        if best is None or nbytes < best[0]:
            best = (nbytes, key, value, default)
    if best is None or best[0] == float("inf"):
        now = ", ".join(
            f"model.{k}={_setting(config, k)}" for k in SIZE_SETTINGS[config.model.variant]
        )
        return f"Lower the model size (now {now}) or run where more memory is free"
    nbytes, key, value, default = best
    return (
        f"Lower model.{key} (now {value}; at its default, {default}, the model's training "
        f"state needs about {_words(COPIES * nbytes)}) or run where more memory is free"
    )


def _words(nbytes: float) -> str:
    return f"{nbytes / GIB:,.1f} GiB" if nbytes >= GIB else f"{nbytes / MIB:,.0f} MiB"


def _setting(config: Config, key: str):
    section, field = key.split(".")
    return getattr(getattr(config.model, section), field)


def _with(config: Config, key: str, value) -> Config:
    section_name, field = key.split(".")
    section = getattr(config.model, section_name).model_copy(update={field: value})
    model = config.model.model_copy(update={section_name: section})
    return config.model_copy(update={"model": model})
