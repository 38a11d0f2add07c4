"""``python -m tfbnn.cli``: the ``tfbnn`` command."""

import sys

from tfbnn.cli import main

sys.exit(main())
