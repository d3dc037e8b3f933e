"""`batchscope soak`: a long mixed load against a running server, checking that nothing is lost, repeated or
leaked. arguments.py (its command line), campaign.py (the run, `main`), client.py (the requests and their checks),
viewers.py (the mode flipper and websocket viewers), findings.py (the verdict).

It talks to the server over HTTP and websockets only and imports nothing else of batchscope, so it can drive a
server that runs elsewhere. `python -m batchscope.app.soak` runs it.
"""
