"""Memory hygiene of the test process, and a per-module memory record.

One pytest process runs every module in turn. Models, tokenizers and episodes a module loads are freed when its
fixtures end, but glibc keeps the freed blocks of its heap resident, so without help the process's resident memory
ratchets up to the sum of what earlier modules held. After each module (once pytest has dropped its last test's
fixture values) this empties the per-process caches of the real tokenizers, processors and tiny models the tests
build (the next module that needs one builds it again, in seconds) and aiohttp's middleware cache, collects garbage
and hands freed heap pages back to the OS (:func:`toolgym.resources.release_memory`). Inside a module, a test that
leaves the process more than ``_RELEASE_ABOVE_MB`` above its last released level is followed by a release too.

With ``TOOLGYM_TEST_MEMORY=FILE`` each module is a phase of :class:`toolgym.resources.Phases`: its peak resident
memory (sampled while the module runs), its resident memory after the release (MiB) and its wall seconds are
appended to ``FILE``, one JSON line per module: docs/reliability.md's "Test-suite memory" figures.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from toolgym.resources import Phases, current_rss_mb, release_memory

_RECORD = os.environ.get("TOOLGYM_TEST_MEMORY")
#: one phase per test module (``Phases.mark`` ends the open one and releases memory before the next)
_phases = Phases() if _RECORD else None
_state: dict[str, str | None] = {"module": None}
#: a test that leaves the process this far (MiB) above its resident memory after the last release is followed by a
#: release of its own, so one module's heavy tests do not stack their freed memory up to the module's end
_RELEASE_ABOVE_MB = 512.0
_state_rss: dict[str, float] = {"released": current_rss_mb() or 0.0}


def _clear_test_caches() -> None:
    """Empty every ``functools`` cache of the test helpers and of toolgym's and trainers' modules (tokenizers,
    processors, tiny models, task sets): what one module built is not kept resident through the rest of the run."""
    import sys

    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("tests.", "toolgym.", "toolgym", "trainers.")):
            continue
        for value in list(vars(module).values()):
            clear = getattr(value, "cache_clear", None)
            if callable(clear) and hasattr(value, "cache_info"):  # a functools cache, nothing else
                clear()
    # aiohttp memoises each route's middleware chain keyed by (handler, apps) for the life of the process
    # (`aiohttp.web_app._cached_build_middleware`, 1,024 entries): a served app's bound handlers keep its server,
    # and so its model, alive after the server stopped
    web_app = sys.modules.get("aiohttp.web_app")
    cached = getattr(web_app, "_cached_build_middleware", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


def _module_of(item: pytest.Item | None) -> str | None:
    return None if item is None else item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    module = _module_of(item)
    if _phases is not None and _state["module"] != module:
        _state["module"] = module
        _phases.mark(module)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # after the test's teardown and after pytest dropped its fixture values (``item.funcargs``)
    module = _module_of(item)
    if _module_of(nextitem) == module:
        rss = current_rss_mb()
        if rss is not None and rss > _state_rss["released"] + _RELEASE_ABOVE_MB:
            release_memory()  # a heavy test inside a module: its freed activations and models go back now
            _state_rss["released"] = current_rss_mb() or 0.0
        return
    _clear_test_caches()
    if _phases is None:
        release_memory()
    else:
        _phases.mark(None)  # closes the module's phase (its sampled peak), then releases memory
        _state["module"] = None
        row = _phases.phases.get(module or "", {})
        with open(str(_RECORD), "a", encoding="utf-8") as f:
            f.write(json.dumps({"module": module, "peak_rss_mb": row.get("peak_rss_mb"),
                                "rss_after_mb": round(current_rss_mb() or 0.0, 1),
                                "wall_s": row.get("wall_s")}) + "\n")
    _state_rss["released"] = current_rss_mb() or 0.0
