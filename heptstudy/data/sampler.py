"""Interleaved-shard sampling (one event per non-empty shard per round, shards shuffled),
distributed (every rank sees the same number of batches) and exactly resumable."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from heptstudy.errors import DataError


def interleaved_order(shard_sizes: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """One epoch of global indices in interleaved-shard order (vectorised, O(N log N))."""
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shard = np.repeat(np.arange(len(sizes)), sizes)
    # position of each event within its shard after the within-shard shuffle = its round
    rounds = np.concatenate([np.arange(n) for n in sizes])
    index = np.concatenate(
        [lo + rng.permutation(int(n)) for lo, n in zip(offsets[:-1], sizes, strict=True)]
    )
    # within a round, the active shards come in a random order: one random key per (round, shard)
    n_rounds = int(sizes.max())
    keys = rng.random((n_rounds, len(sizes)))
    order = np.lexsort((keys[rounds, shard], rounds))
    return index[order]


class InterleavedShardSampler:
    """Iterable of global event indices for one rank; see the module docstring."""

    def __init__(
        self,
        shard_sizes: Sequence[int],
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        mode: str = "interleaved_shards",
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(
                f"rank={rank}, world_size={world_size}: need world_size >= 1 and 0 <= rank < "
                "world_size; check the launcher's RANK/WORLD_SIZE"
            )
        self.shard_sizes = [int(s) for s in shard_sizes]
        self.num_events = sum(self.shard_sizes)
        if self.num_events < world_size:
            raise DataError(
                f"the data set has {self.num_events} events, fewer than world_size={world_size}: "
                "every rank needs at least one event per epoch; generate or select more events"
            )
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.mode = mode
        self.epoch = 0
        self.position = 0
        self._cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.num_events // self.world_size

    def epoch_indices(self, epoch: int) -> np.ndarray:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        if self.mode == "sequential":
            order = np.arange(self.num_events, dtype=np.int64)
        else:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
            order = interleaved_order(self.shard_sizes, rng)
        mine = order[self.rank :: self.world_size][: len(self)]
        self._cache = (epoch, mine)
        return mine

    def take(self, n: int) -> list[int]:
        """The next ``n`` indices, continuing into the following epochs as needed."""
        out: list[int] = []
        while len(out) < n:
            idx = self.epoch_indices(self.epoch)
            if self.position >= len(idx):
                self.epoch, self.position = self.epoch + 1, 0
                continue
            got = idx[self.position : self.position + n - len(out)]
            out.extend(int(i) for i in got)
            self.position += len(got)
        return out

    def state_dict(self) -> dict[str, Any]:
        keys = ("epoch", "position", "seed", "rank", "world_size", "mode")
        return {**{k: getattr(self, k) for k in keys}, "shard_sizes": list(self.shard_sizes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "world_size", "mode", "shard_sizes"):
            if (theirs := state.get(key)) != (mine := getattr(self, key)):
                raise DataError(
                    f"sampler state has {key}={theirs!r} but this run has {key}={mine!r}; a run "
                    "can only resume with the same data set, seed, sampler and world size: "
                    "restore those settings or start a new run"
                )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
