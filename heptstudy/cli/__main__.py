"""``python -m heptstudy.cli ...`` (as torchrun starts ``heptstudy train``): the ``heptstudy`` command."""

import sys

from heptstudy.cli import main

sys.exit(main())
