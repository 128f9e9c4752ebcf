"""The parameters of ``pipeline.ipynb``; papermill's strings parse as in the measurement
request, and parameters the notebook does not have are refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from heptstudy.config import Config, load_config, parse_plan_name
from heptstudy.measure.request import (
    Count,
    OptionalNumber,
    OptionalPath,
    Overrides,
    RequestError,
    check_parameters,
    describe_errors,
    injected_parameters,
)


class PipelineParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    out_dir: OptionalPath = "experiments/pipeline"
    batch_size: Count = 2
    num_steps: Count = 4
    val_freq: Count = 2
    checkpoint_freq: Count = 2
    checkpointing: Annotated[str, BeforeValidator(parse_plan_name)] = "full"
    data_dir: OptionalPath = None
    seed: OptionalNumber = None
    overrides: Overrides = []

    @classmethod
    def build(cls, **values: Any) -> PipelineParameters:
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise RequestError(describe_errors(err, sorted(cls.model_fields))) from None

    def config(self, out_dir: str | None = None) -> Config:
        train: dict[str, Any] = {
            "global_batch_size": self.batch_size,
            "num_steps": self.num_steps,
            "val_freq": self.val_freq,
            "checkpoint_freq": self.checkpoint_freq,
            "out_dir": out_dir or self.out_dir or "experiments/pipeline",
        }
        if self.seed is not None:
            train["seed"] = self.seed
        data = {"data_dir": self.data_dir} if self.data_dir else {}
        model = {"heptv2": {"activation_checkpointing": self.checkpointing}}
        return load_config(
            base={"model": model, "data": data, "train": train}, overrides=self.overrides
        )


def pipeline_parameters(namespace: Mapping[str, Any]) -> PipelineParameters:
    allowed = tuple(PipelineParameters.model_fields)
    check_parameters(injected_parameters(namespace.get("In")), allowed, "pipeline.ipynb")
    return PipelineParameters.build(**{k: namespace[k] for k in allowed if k in namespace})
