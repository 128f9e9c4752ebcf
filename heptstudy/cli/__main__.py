"""``python -m heptstudy.cli ...`` (as torchrun starts ``heptstudy train``): ``python -m heptstudy``."""

import runpy

runpy.run_module("heptstudy.__main__", run_name="__main__")
