"""`python -m batchscope.app.soak ...`: the same as `batchscope soak ...`."""
import sys

from .campaign import main

sys.exit(main())
