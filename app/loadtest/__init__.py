"""Load tests against the engine: bursts, sync-vs-async A/B comparisons, continuous loads and sweeps, run on
background threads and timed on the client side.
    specs.py          what a run asks for (BurstSpec, LoadSpec) and the caps it is checked against (Limits)
    statuses.py       what a run reports (progress, latency percentiles, throughput, mode switches seen)
    refusals.py       why a run is refused (BusyError, ModeLocked, validation_reason)
    arrivals.py       the requests of a run, drawn from its seed: arrival times, synthetic prompts, lengths
    client_timing.py  each request timed as it streams, and the run's TTFT/TPOT/ITL/E2E and throughput
    runs.py           a burst, an A/B run, a continuous load while it goes on
    sender.py         how a run's requests travel to the engine and back
    manager.py        BurstManager: starts runs, admits or refuses them, keeps their results, guards the mode
    sweep/            sweeps: rising offered rates in each mode, judged by SLOs (its __init__ lists its rooms)
    foreign/          GuideLLM and vllm bench serve reports read into the sweep's point shape
Imports run down into engine and telemetry only: app/server and app/ui use this package, never the reverse.
"""
