"""``python -m runnel``: the same entry point as the ``runnel`` console script."""

from __future__ import annotations

import sys

from runnel.cli import main

if __name__ == "__main__":
    sys.exit(main())
