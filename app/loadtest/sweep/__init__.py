"""Sweeps: in each mode, a synchronous run, a throughput run, then rising offered rates, each point timed on the
client side like a burst.
    spec.py      what a sweep asks for (SweepSpec) and the SLOs its points are judged by
    curves.py    a point's figures (percentiles, SLO attainment, goodput), knees, the rates meeting the SLOs
    progress.py  what a sweep reports (its points, each mode's curve, the point running now)
    sweeps.py    Sweeps: runs a sweep on the engine it holds alone, keeps the last few and foreign reports
    files.py     a sweep as batchscope.sweep/1 JSON and as CSV
    remote.py    `batchscope sweep`: a sweep on a running server, through its routes
"""
