"""Fixtures of the browser tests: one chromium per module, a fresh page per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .support import CHROMIUM, CHROMIUM_ARGS, chromium_missing_reason

_missing = chromium_missing_reason()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope: while sync Playwright runs, its event loop counts as running in this
    # thread, which would break the asyncio tests of later modules in the same session.
    if _missing:
        pytest.skip(_missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()
