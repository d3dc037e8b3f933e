"""The dashboard's browser side (timeline.js, style.css), shipped inside the package and found with
importlib.resources."""
