"""`python -m batchscope.app.soak ...`: the same as `batchscope soak ...`."""
import sys

from .run import main

sys.exit(main())
