"""``python -m zoo`` (and ``torchrun -m zoo train ...``) run the ``zoo`` command."""

import sys

from zoo.cli import main

sys.exit(main())
