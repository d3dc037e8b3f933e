"""Server tests: a batchscope server on the tiny model, in this process (helpers.tiny_served) or as a subprocess
(helpers.serve_subprocess), spoken to over HTTP and websockets."""
