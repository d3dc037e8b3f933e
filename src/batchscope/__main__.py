"""`python -m batchscope ...` is the `batchscope` command."""
import sys

from batchscope.app.cli import main

sys.exit(main())
