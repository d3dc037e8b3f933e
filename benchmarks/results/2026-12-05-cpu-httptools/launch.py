import sys, runpy, os
import uvicorn
http, loop = os.environ["HTTP_IMPL"], os.environ["LOOP_IMPL"]
orig = uvicorn.Config.__init__
def init(self, *a, **k):
    k["http"], k["loop"] = http, loop
    orig(self, *a, **k)
uvicorn.Config.__init__ = init
sys.argv = ["batchscope", "serve", "--model", "tiny-random", "--device", "cpu", "--no-ui", "--port", "8790"]
runpy.run_module("batchscope", run_name="__main__")
