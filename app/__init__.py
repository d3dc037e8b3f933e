"""The dashboard side of batchscope: the HTTP server (server/), the Gradio page it mounts (ui/), load tests
(loadtest/), the `bench` and `soak` tools (bench/, soak/) and the command line (cli.py).

Imports run cli -> server -> ui -> loadtest, and every one of them down into telemetry and engine; bench and soak
stand on their own. Importing this package loads nothing.
"""
