"""The ``data`` section: which events are read and how they are batched."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from heptstudy.config.strict import StrictInput, named_folder


class DataConfig(StrictInput):
    data_dir: str = "data/tfds"
    dataset: str = Field("cld_edm_ttbar_hits:3.2.1", pattern=r"^[a-z0-9_]+:\d+\.\d+\.\d+$")
    configs: list[str] = Field(default_factory=lambda: ["1"], min_length=1)
    pad_to_multiple: int = Field(128, ge=1)
    batching: Literal["padded", "packed"] = Field(
        "padded",
        description="padded: every event filled to the batch's longest (the recipe's); packed: "
        "the batch's events in one stream of hits, each rounded up on its own",
    )
    sampler: Literal["interleaved_shards", "sequential"] = "interleaved_shards"
    nvalid: int = Field(16, ge=0)
    ntest: int = Field(16, ge=0)
    num_workers: int = Field(0, ge=0, description="reader threads per batch (0: read in turn)")
    prefetch_batches: int = Field(
        2, ge=0, description="batches read ahead during training while a step runs (0: none)"
    )

    @field_validator("data_dir")
    @classmethod
    def _data_dir_named(cls, value: str) -> str:
        # input data is relative to the repository (heptstudy.paths): '' would be its root
        return named_folder(
            value, "the repository's root folder, which holds no data set", "data/tfds"
        )

    @field_validator("configs")
    @classmethod
    def _configs_once(cls, configs: list[str]) -> list[str]:
        if repeated := sorted({c for c in configs if configs.count(c) > 1}):
            # a repeated builder config would read its events twice as if they were others
            raise ValueError(
                f"data.configs={configs} names {repeated} more than once; list each builder "
                "config once"
            )
        return configs

    @property
    def name(self) -> str:
        return self.dataset.split(":")[0]

    @property
    def version(self) -> str:
        return self.dataset.split(":")[1]
