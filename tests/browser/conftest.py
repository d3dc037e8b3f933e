"""Browser tests: Debian's Chromium driven through Playwright's Python package (never a downloaded browser).

Every test here is skipped, with the reason, where Chromium or Playwright is missing (CI counts such a skip as a
failure: see the root conftest)."""
from __future__ import annotations

import importlib.util
import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync"]
MISSING = (f"{CHROMIUM} is not installed" if not os.path.exists(CHROMIUM)
           else "playwright is not installed" if importlib.util.find_spec("playwright") is None else None)


def pytest_runtest_setup(item):
    if MISSING:
        pytest.skip(MISSING)


@pytest.fixture(scope="module")
def browser():
    """One Chromium per test module."""
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
