"""The batchscope page in Gradio: page.py puts it together, generate_tab.py and load_tab.py are its two tabs of
controls, page_html.py and load_html.py the HTML that Python renders for them. The live charts are assets/js's.

It reads the server's AppState through its methods only and imports nothing of app/server (which mounts it).
"""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")     # before any module here imports gradio
