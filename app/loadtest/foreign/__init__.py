"""Other tools' load-test reports read into a sweep's point shape, to draw their curves over ours.
    reports.py   which tool wrote a report, and `vllm bench serve` results
    guidellm.py  GuideLLM JSON reports (the 0.3, 0.4, 0.5-0.6 and 0.7-0.8 layouts)
    shape.py     the point shape: latency summaries of raw values, the raw values kept for CDFs
"""
