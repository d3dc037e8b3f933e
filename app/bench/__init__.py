"""`batchscope bench`: batchscope's sync and async loops (and transformers' continuous batching) timed on one
workload against the decode step's floor. options.py (its command line, argparse only), run.py (the order of work,
`main`), systems.py (the runners), floor.py (bandwidth, GEMM peak, the floors), report.py (the table, token checks).

Importing the package loads none of torch or transformers; run.py does. `python -m batchscope.app.bench` runs it.
"""
from .report import _digest, disagreeing_runs  # noqa: F401  (token checks, light: read from here by engine tests)
