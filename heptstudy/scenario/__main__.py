"""``python -m heptstudy.scenario resolve|render ...`` (used by scripts/*/train_scenario.sh)."""

import sys

from heptstudy.cli.scenario import main

sys.exit(main())
