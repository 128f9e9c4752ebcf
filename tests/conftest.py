import pytest
import torch

from heptstudy.config import load_config

#: A model small enough for many CPU tests, with every structural feature of the real one.
TINY_MODEL = [
    "model.heptv2.embedding_dim=16",
    "model.heptv2.num_heads=2",
    "model.heptv2.width=32",
    "model.heptv2.num_convs=3",
    "model.heptv2.block_size=16",
    "model.heptv2.num_regions=6",
    "model.heptv2.n_hashes=2",
    "model.decoder.num_layers=2",
    "model.decoder.num_queries=12",
    "model.decoder.num_heads=2",
    "model.track_cluster.embedding_dim=16",
    "model.track_cluster.width=32",
    "model.track_cluster.num_heads=2",
    "model.track_cluster.num_layers=2",
    "data.pad_to_multiple=16",
]


@pytest.fixture(autouse=True)
def _few_threads():
    # Two-core CI: keep intra-op threads predictable across tests.
    torch.set_num_threads(2)


@pytest.fixture
def tiny_overrides():
    return list(TINY_MODEL)


@pytest.fixture
def tiny_config():
    return load_config(overrides=TINY_MODEL)
