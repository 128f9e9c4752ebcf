"""Training scenarios and platform profiles: resolution, invariant checks, launch rendering (not
the command line: it calls :mod:`heptstudy.fitting`, which resolves scenarios through this)."""

from heptstudy.scenario.model import find_platform
from heptstudy.scenario.render import render
from heptstudy.scenario.resolve import resolve
from heptstudy.scenario.rules import ScenarioError

__all__ = ["ScenarioError", "find_platform", "render", "resolve"]
