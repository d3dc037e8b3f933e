"""The telemetry package's public names stay what they are whatever else is imported: a subpackage named like one
of them would replace it on the package once loaded (`batchscope.telemetry.compare`, the summaries' comparison,
became a module the day a room of that name was imported)."""
import importlib
import pkgutil

import batchscope.telemetry as telemetry


def test_no_subpackage_shadows_a_public_name():
    rooms = {m.name for m in pkgutil.iter_modules(telemetry.__path__)}
    assert not rooms & set(telemetry.__all__), rooms & set(telemetry.__all__)
    for name in rooms:
        importlib.import_module(f"batchscope.telemetry.{name}")
    for name in telemetry.__all__:
        assert not hasattr(getattr(telemetry, name), "__path__"), name      # still the function, not a module
