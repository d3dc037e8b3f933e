"""The dashboard's browser side (js/: ES modules with main.js as the entry; style.css), shipped inside the package
and found with importlib.resources."""
