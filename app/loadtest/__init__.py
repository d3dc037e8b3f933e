"""Load tests against the engine: bursts, sync-vs-async A/B comparisons and continuous loads, run on background
threads and timed on the client side.

    specs.py     what a run asks for (BurstSpec, LoadSpec) and the caps it is checked against (Limits)
    statuses.py  what a run reports (progress, latency percentiles, throughput, mode switches seen)
    refusals.py  why a run is refused (BusyError, ModeLocked, validation_reason)
    plans.py     the requests of a run, drawn from its seed: arrival times, synthetic prompts, lengths
    metrics.py   each request timed as it streams, and the run's TTFT/TPOT/ITL/E2E and throughput
    runs.py      a burst, an A/B run, a continuous load while it goes on
    sender.py    how a run's requests travel to the engine and back
    manager.py   BurstManager: starts runs, admits or refuses them, keeps their results, guards the mode

Imports run down into engine and telemetry only: app/server and app/ui use this package, never the reverse.
"""
