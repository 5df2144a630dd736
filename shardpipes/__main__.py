"""``python -m shardpipes``: the ``shardpipes`` command."""

import sys

from shardpipes.cli import main

sys.exit(main())
