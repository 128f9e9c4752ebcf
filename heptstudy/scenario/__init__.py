"""Training scenarios and platform profiles: resolution, invariant checks and launch rendering.

A *scenario* (``configs/training/scenarios/NAME.yaml``) holds the science; a *platform profile*
(``configs/training/platforms/NAME.yaml``) holds the hardware and runtime. One job per module:

* :mod:`~heptstudy.scenario.model`: the scenario schema, loading scenarios and platforms;
* :mod:`~heptstudy.scenario.rules`: the named invariants (:data:`RULES`) and :class:`ScenarioError`;
* :mod:`~heptstudy.scenario.resolve`: :func:`resolve` a scenario on a platform, :func:`summary`;
* :mod:`~heptstudy.scenario.render`: launch commands, Slurm and local launch scripts;
* :mod:`~heptstudy.cli.scenario`: ``heptstudy scenario resolve|render`` and
  ``python -m heptstudy.scenario`` (not imported here: the command line sits on top of the
  library, and it calls :mod:`heptstudy.fitting`, which resolves scenarios through this package).
"""

from heptstudy.scenario.model import Scenario, find_platform, load_scenario
from heptstudy.scenario.render import launch_command, render
from heptstudy.scenario.resolve import Resolution, ResolvedVariant, resolve, summary
from heptstudy.scenario.rules import BUDGET_KEYS, RULES, ScenarioError

__all__ = [
    "BUDGET_KEYS",
    "RULES",
    "Resolution",
    "ResolvedVariant",
    "Scenario",
    "ScenarioError",
    "find_platform",
    "launch_command",
    "load_scenario",
    "render",
    "resolve",
    "summary",
]
