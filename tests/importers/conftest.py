"""Importer tests: other engines' profiler traces (tests/fixtures, or built by kineto_builder.py) read into
timelines; no model, no server, no browser. With unit/, the `make test-fast` lane."""
