"""`batchscope bench`: batchscope's sync and async loops (and transformers' continuous batching) timed on one
workload against the decode step's floor. options.py (its command line, argparse only), run.py (the order of work,
`main`), systems.py (the runners), floor.py (bandwidth, GEMM peak, the floors), report.py (the tables, token checks),
output.py (what both workloads share: messages, run order, the result's head, its files).
`--workload served` (requests arriving over time, mixed lengths): served.py (the plan, sending and timing it),
served_figures.py (a run's figures), served_run.py (its order of work), steps.py (a timeline's steps by kind).

Importing the package loads none of torch or transformers; run.py does. `python -m batchscope.app.bench` runs it.
"""
from .summary_table import _digest, disagreeing_runs  # noqa: F401  (token checks, light: read from here by engine tests)
