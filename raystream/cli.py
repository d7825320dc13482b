"""The ``raystream`` command line (see :mod:`raystream.engine.cli`): ``python -m raystream.cli``."""

import sys

from raystream.engine.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
