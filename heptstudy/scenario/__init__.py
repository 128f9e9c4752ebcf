"""Training scenarios and platform profiles: resolution, invariant checks and launch rendering.

A *scenario* (``configs/training/scenarios/NAME.yaml``) holds the science; a *platform profile*
(``configs/training/platforms/NAME.yaml``) holds the hardware and runtime. The command line
(:mod:`heptstudy.cli.scenario`) is not imported here: it sits on top of the library and calls
:mod:`heptstudy.fitting`, which resolves scenarios through this package.
"""

from heptstudy.scenario.model import find_platform
from heptstudy.scenario.render import render
from heptstudy.scenario.resolve import resolve
from heptstudy.scenario.rules import ScenarioError

__all__ = ["ScenarioError", "find_platform", "render", "resolve"]
