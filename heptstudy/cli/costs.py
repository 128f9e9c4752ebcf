"""`heptstudy costs`: the op-group cost table solver plans (``keepNN``) are chosen from."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from heptstudy.cli import not_blank
from heptstudy.paths import resolve_from_cwd

_NOTHING_WRITTEN = "nothing was written (the table appears only whole); run the same command again"


def _costs(args: argparse.Namespace) -> int:
    import torch

    from heptstudy.config import load_config
    from heptstudy.data.batching import dataset_for, event_indices, load_events
    from heptstudy.errors import HeptstudyError
    from heptstudy.measure import op_costs
    from heptstudy.meters.allocator import apply_allocator, measurement_allocator
    from heptstudy.paths import base_dir

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HeptstudyError(
            f"--device {args.device}: this machine has no CUDA device PyTorch can use (torch "
            f"{torch.__version__}); measure GPU seconds on a GPU machine, or give --device cpu"
        )
    out = Path(args.out) if args.out is not None else op_costs.default_out(device)
    op_costs.check_out(out, "--out" if args.out is not None else "the default output")
    # a --data-dir typed in a shell is the working directory's, as `ls` reads it
    typed = [f"data.data_dir={json.dumps(str(resolve_from_cwd(args.data_dir)))}"]
    given = [*args.overrides, *(typed if args.data_dir is not None else [])]
    config = load_config(args.config, given)
    train = dataset_for(config, "train")
    if args.batch_size > len(train):  # the sampler would repeat events to fill the batch
        raise HeptstudyError(
            f"--batch-size {args.batch_size} needs {args.batch_size} events of the train split, "
            f"but {train.name} in {config.data.data_dir} holds {len(train)}; lower --batch-size "
            "or generate more events (heptstudy data generate)"
        )
    indices = event_indices(config, args.batch_size, 1)[0]
    if empty := train.empty_events(indices):
        raise HeptstudyError(
            f"{len(empty)} of the events drawn hold no hits ({'; '.join(empty[:3])}): their "
            "slots would price no work, so nothing was measured. Draw others with another seed "
            "(--set train.seed=N), or use a data set without empty events"
        )
    batch = load_events(config, indices)
    # relative to the repository when it lies inside: a committed table names no one's home folder
    data_dir, repo = Path(config.data.data_dir), base_dir()
    data = {
        "dataset": config.data.dataset,
        "data_dir": str(data_dir.relative_to(repo) if data_dir.is_relative_to(repo) else data_dir),
        "split": "train",
        "event_indices": [int(i) for i in indices],
        "batching": config.data.batching,
        "synthetic": bool(train.metadata.get("synthetic", False)),
    }
    # the forwards timed as the study's steps run them (on a CPU, glibc keeping freed memory):
    # as it comes, the page faults of returned memory land in the ungrouped ops' seconds
    # (experiments/cost_table_allocator/)
    settings = {} if args.allocator == "default" else measurement_allocator(None, device.type)
    allocator = apply_allocator(settings or {})
    table = op_costs.measure_op_costs(config, batch, repeats=args.repeats, device=device, data=data)
    table["allocator"] = {"name": allocator.name, "settings": allocator.settings}
    print(op_costs.table_text(table))
    op_costs.write_table(table, out)
    print(f"written: {out}")
    return 0


def _device(value: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``: the devices a table's seconds are measured on."""
    kind, colon, index = value.partition(":")
    if (kind == "cpu" and not colon) or (kind == "cuda" and (not colon or index.isdigit())):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r} is not a device to measure on: give cpu, cuda or cuda:N (N a GPU's index)"
    )


def _json_path(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError(
            "an empty path: give the .json file to write the table to, or leave --out out for "
            "the default (experiments/local/costs/op_costs_DEVICE.json)"
        )
    return value


def register_cli(sub) -> None:
    from heptstudy.cli import add_config_args, whole_number

    p = sub.add_parser(
        "costs",
        help="measure the op-group cost table keepNN checkpointing plans are solved on",
        description="For each layer kind and op group a checkpointed layer may keep: the bytes "
        "kept (exact, fake tensors) and the seconds its recomputation costs (measured on this "
        "machine's --device), per slot of the batch; printed and written as JSON",
    )
    p.add_argument(
        "--data-dir",
        type=not_blank("--data-dir"),
        help="shorthand for --set data.data_dir=DIR (a relative DIR from the working directory)",
    )
    p.add_argument(
        "--batch-size", type=whole_number(1, 4), default=4, help="events measured (default 4)"
    )
    p.add_argument(
        "--repeats",
        type=whole_number(1, 3),
        default=3,
        help="timed forwards per layer kind; the median counts (default 3)",
    )
    p.add_argument(
        "--device", type=_device, default="cpu", help="cpu, cuda or cuda:N (GPU seconds)"
    )
    p.add_argument(
        "--threads",
        type=whole_number(1, 2),
        help="torch intra-op threads (default: PyTorch's choice)",
    )
    p.add_argument(
        "--allocator",
        choices=("platform", "default"),
        default="platform",
        help="platform (default): on a CPU, local_cpu's host allocator settings, as the study's "
        "runs measure; default: the allocator as it comes",
    )
    p.add_argument(
        "--out",
        type=_json_path,
        help="JSON file for the table (default experiments/local/costs/op_costs_DEVICE.json); "
        "replaces only a cost table",
    )
    add_config_args(p)
    p.set_defaults(func=_costs, interrupted=_NOTHING_WRITTEN)
