"""``python -m cli``: the ``millstream`` command (how a local cluster starts its processes)."""

import sys

from cli.main import main

sys.exit(main())
