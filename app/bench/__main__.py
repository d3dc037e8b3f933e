"""`python -m batchscope.app.bench ...`: the same as `batchscope bench ...`, without the server's packages."""
import sys

from batchscope.engine.parallel.ranks import leave

from .command import main

sys.exit(leave(main()))
