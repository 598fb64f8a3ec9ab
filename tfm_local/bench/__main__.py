"""``python -m tfm_local.bench [COMMAND] [options]``: the ``tfm-bench`` command where its console script is not
installed (a checkout on ``PYTHONPATH``); see ``commands``."""
import sys

from .commands import main

if __name__ == "__main__":
    sys.exit(main())
