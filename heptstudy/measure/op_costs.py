"""The op-group cost table (`heptstudy costs`): for each layer kind and op group
(:mod:`heptstudy.model.op_groups`), the bytes keeping it holds (exact, from a fake-tensor forward:
:func:`heptstudy.estimate.group_bytes.op_group_bytes`) and the seconds recomputing it costs,
measured: every op of real training-mode forwards of one layer is timed and counted to the group
that would keep it, or to ``rest`` (ops of no group: always recomputed). On CUDA each op is
bracketed by synchronisations, so the seconds are the GPU's. Both are per slot of the measured
batch, so that a plan does not depend on the batch size (the decoder's query-side groups grow
with events rather than slots: per slot holds for batches of events like the measured ones)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from heptstudy.atomic import folder_write_problem, json_text, write_text_or_keep
from heptstudy.config import Config
from heptstudy.data.batching import to_device
from heptstudy.data.layout import layout_of
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.group_bytes import op_group_bytes
from heptstudy.measure.report import device_name, load_average
from heptstudy.model import build_model
from heptstudy.model.activation_checkpointing import lean_recompute
from heptstudy.model.checkpoint_plan import checkpoint_slots
from heptstudy.model.cost_table import (
    COSTS_FILE,
    KINDS,
    SCHEMA,
    backend_in_effect,
    configuration_key,
    layer_counts,
)
from heptstudy.model.heptv2 import hit_coordinates
from heptstudy.model.op_groups import group_of, groups_of, kept_pairs, track_roles
from heptstudy.paths import OUTPUT_ROOT, git
from heptstudy.train.precision import autocast_dtype

REST = "rest"
DEFAULT_REPEATS = 3


def default_out(device: torch.device) -> Path:
    return OUTPUT_ROOT / "costs" / f"op_costs_{device.type}.json"


class _OpTimer(TorchDispatchMode):
    """Sums each op's wall time into the group that would keep its output (else ``rest``)."""

    def __init__(self, pairs, device: torch.device):
        super().__init__()
        self.pairs = pairs
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        group = group_of(self.pairs, func) or REST
        if self.cuda:  # the queue drained, so the op's own kernels alone are timed
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds[group] = self.seconds.get(group, 0.0) + time.perf_counter() - start
        return out


def one_layer(config: Config, kind: str, device: torch.device) -> torch.nn.Module:
    """The first ``kind`` layer of the model, as initialised, uncheckpointed, training."""
    plain = config.model_copy(deep=True)
    plain.model.heptv2.activation_checkpointing = "off"
    torch.manual_seed(config.train.seed)
    layers, i = checkpoint_slots(build_model(plain))[(kind, 0)]
    layer = layers[i].to(device).train()
    track_roles(layer, kind)
    return layer


def layer_inputs(kind: str, batch, config: Config, device: torch.device) -> tuple:
    """The inputs one layer sees in a step: hit embeddings (random: the ops' time does not follow
    their values), the real mask, coordinates and layout; the decoder's queries (random)."""
    mask, layout = batch["mask"], layout_of(batch)
    dim = config.model.heptv2.embedding_dim
    generator = torch.Generator(device="cpu").manual_seed(config.train.seed)
    hits = torch.randn(*mask.shape, dim, generator=generator).to(device).requires_grad_()
    if kind == "backbone":
        return hits, mask, hit_coordinates(batch["X"]), layout
    queries = torch.randn(layout.num_events, config.model.decoder.num_queries, dim)
    return queries.to(device).requires_grad_(), hits, [None] * layout.num_events, layout


def time_groups(
    config: Config, batch, kind: str, repeats: int, device: torch.device
) -> dict[str, float]:
    """Per group of a ``kind`` layer (and ``rest``): the median over ``repeats`` forwards (after
    one unmeasured) of its ops' summed seconds on ``batch``."""
    batch = to_device(batch, device)
    layer = one_layer(config, kind, device)
    pairs = kept_pairs(kind, frozenset(g.name for g in groups_of(kind)))
    dtype = autocast_dtype(config, device)
    runs: list[dict[str, float]] = []
    for _ in range(repeats + 1):
        args = layer_inputs(kind, batch, config, device)
        timer = _OpTimer(pairs, device)
        # lean, as a checkpointed layer of an ops plan recomputes
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None), lean_recompute():
            with timer:
                layer(*args)
        runs.append(timer.seconds)
        del args
    names = [*(g.name for g in groups_of(kind)), REST]
    return {n: statistics.median(run.get(n, 0.0) for run in runs[1:]) for n in names}


def measure_op_costs(
    config: Config,
    batch,
    *,
    repeats: int = DEFAULT_REPEATS,
    device: torch.device,
    data: dict[str, Any],
) -> dict[str, Any]:
    """The cost table of ``config`` on ``batch`` (``data`` says where it came from)."""
    layout = layout_of(batch)
    geometry = layout.geometry
    load_before = load_average()
    kinds = {}
    for kind in KINDS:
        sizes = op_group_bytes(config, batch, kind)
        seconds = time_groups(config, batch, kind, repeats, device)
        kinds[kind] = _per_slot(sizes, seconds, geometry.slots)
    return {
        "schema": SCHEMA,
        "model_key": configuration_key(config),
        "attention_backend": backend_in_effect(config, device.type),
        "layers": layer_counts(config),
        "device": device_name(device),
        "device_type": device.type,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        # other work on the machine inflates the seconds (threads wait for cores): say how busy
        "load_average_1min": {"before": load_before, "after": load_average()},
        "git_commit": (git("rev-parse", "HEAD") or "").strip() or None,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "data": data,
        "geometry": {**asdict(geometry), "hits": [s.hits for s in layout.spans]},
        "timing": f"median of {repeats} forwards of one layer (after one unmeasured) of each "
        "group's summed op seconds" + ("; each op synchronised" if device.type == "cuda" else ""),
        "kinds": kinds,
    }


def _per_slot(sizes: dict[str, int], seconds: dict[str, float], slots: int) -> dict[str, Any]:
    groups = {
        name: {
            "bytes": size,
            "seconds": seconds[name],
            "bytes_per_slot": size / slots,
            "seconds_per_slot": seconds[name] / slots,
        }
        for name, size in sizes.items()
    }
    rest = {"seconds": seconds[REST], "seconds_per_slot": seconds[REST] / slots}
    return {"groups": groups, "rest": rest}


def table_text(table: dict[str, Any]) -> str:
    """The table as a user reads it: per kind, each group's bytes and milliseconds per batch."""
    g, load = table["geometry"], table.get("load_average_1min") or {}
    lines = [
        f"op-group costs of one layer: {table['device']}, torch {table['torch_version']}, "
        f"{g['events']} events in {g['slots']:,} slots "
        f"({'synthetic' if table['data'].get('synthetic') else 'real'} data), "
        f"model {table['model_key']['digest']}, load average {load.get('before')} before, "
        f"{load.get('after')} after",
        f"{'layer':<9} {'group':<16} {'kept MiB':>9} {'recompute ms':>13} {'ms/MiB':>8}",
    ]
    for kind, entry in table["kinds"].items():
        for name, c in entry["groups"].items():
            mib, ms = c["bytes"] / 2**20, c["seconds"] * 1e3
            ratio = f"{ms / mib:8.2f}" if mib else f"{'-':>8}"
            lines.append(f"{kind:<9} {name:<16} {mib:9.2f} {ms:13.2f} {ratio}")
        lines.append(f"{kind:<9} {REST:<16} {'':>9} {entry['rest']['seconds'] * 1e3:13.2f}")
    return "\n".join(lines)


def check_out(out: Path, option: str = "--out") -> None:
    """Refused before measuring: ``out`` holds a file that is not a cost table, or no .json,
    or lies where nothing can be written."""
    COSTS_FILE.check(out, option)
    problem = folder_write_problem(out.absolute().parent)
    if problem:
        raise HeptstudyError(
            f"{option} {out}: {problem}, so the table cannot be written there; give a path in a "
            "folder you can write to"
        )


def write_table(table: dict[str, Any], out: Path) -> Path:
    """``table`` written atomically to ``out``, replacing only a cost table; refused, the text
    is kept elsewhere and the error says where."""
    text = json_text(table, f"the cost table {out}")
    return write_text_or_keep(out, text, "the cost table", kind=COSTS_FILE)
