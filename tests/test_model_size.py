"""The model-size bound: counted without building the model, refused before any allocation."""

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from heptstudy.config import TRACK_CLUSTER_VARIANT, load_config
from heptstudy.model import build_model
from heptstudy.train.model_size import ModelTooLarge, check_model_fits, model_size
from heptstudy.units import GIB
from tests.conftest import TINY_MODEL

TRACK_CLUSTER = [f"model.variant={TRACK_CLUSTER_VARIANT}", "data.dataset=cld_edm_ttbar_pf:3.2.1"]


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        TINY_MODEL,
        [*TINY_MODEL, "model.heptv2.n_hashes=5", "model.decoder.num_layers=3"],
        [*TINY_MODEL, *TRACK_CLUSTER, "model.track_cluster.num_layers=3"],
    ],
)
def test_the_count_from_one_layer_each_is_the_whole_models(overrides):
    config = load_config(overrides=overrides)
    with torch.device("meta"):
        whole = build_model(config)
    size = model_size(config)
    tensors = [*whole.parameters(), *whole.buffers()]
    assert size.parameters == sum(p.numel() for p in whole.parameters())
    assert size.nbytes == sum(t.numel() * t.element_size() for t in tensors)


# Each is far beyond the address space the child below may use: were any of it allocated (or,
# for the layer count, merely built as modules), the child would fail with MemoryError.
HUGE = [
    ("model.heptv2.width=10000000", "model.heptv2.width (now 10000000; at its default, 512"),
    ("model.heptv2.num_convs=1000000", "model.heptv2.num_convs (now 1000000; at its default"),
    ("model.decoder.num_queries=100000000000", "model.decoder.num_queries (now 100000000000"),
    ("model.heptv2.n_hashes=100000000000", "model.heptv2.n_hashes (now 100000000000"),
    ("model.heptv2.width=10000000000000000000", "more than 2**63 elements"),
    ("model.heptv2.embedding_dim=100000000000", "model.heptv2.embedding_dim (now 100000000000"),
]

CHILD = """
import json, resource, sys
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from heptstudy.config import load_config
from heptstudy.train import model_size
from heptstudy.units import GIB
model_size.host_memory_available = lambda: 2 * GIB  # the same answer on every host
for override in json.loads(sys.argv[1]):
    try:
        model_size.check_model_fits(load_config(overrides=[override]), "cpu")
        print(json.dumps([override, None]))
    except model_size.ModelTooLarge as err:
        print(json.dumps([override, str(err)]))
"""


def test_a_huge_model_is_refused_without_allocating_it():
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    # room for Python and PyTorch, far less than any model of HUGE
    limit = 4 * GIB if hard == resource.RLIM_INFINITY else min(4 * GIB, hard)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            json.dumps([o for o, _ in HUGE]),
            str(limit),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    refusals = dict(json.loads(line) for line in child.stdout.splitlines())
    for override, advice in HUGE:
        words = refusals[override]
        assert words is not None, f"{override} was not refused"
        assert advice in words and "nothing was built or run" in words
        assert "more than 2**63" in words or "2.0 GiB available" in words


def test_a_model_that_fits_is_counted_and_one_that_does_not_names_its_setting(monkeypatch):
    from heptstudy.train import model_size as sizing

    config = load_config(overrides=[*TINY_MODEL, "model.heptv2.width=4096"])
    nbytes = model_size(config).nbytes
    monkeypatch.setattr(sizing, "host_memory_available", lambda: 4 * nbytes)
    assert check_model_fits(config, "cpu") == nbytes
    monkeypatch.setattr(sizing, "host_memory_available", lambda: 4 * nbytes - 1)
    with pytest.raises(ModelTooLarge, match=r"Lower model\.heptv2\.width \(now 4096"):
        check_model_fits(config, "cpu")
