"""Memory hygiene of the test process, and a per-module memory record.

One pytest process runs every module in turn. Models, tokenizers and episodes a module loads are freed when its
fixtures end, but glibc keeps the freed blocks of its heap resident, so without help the process's resident memory
ratchets up to the sum of what earlier modules held. After each module's teardown this empties the per-process
caches of the real tokenizers the tests build (``tests/tokenizers.py``: the next module that needs one builds it
again, in seconds), collects garbage and hands freed heap pages back to the OS
(:func:`toolgym.resources.release_memory`).

With ``TOOLGYM_TEST_MEMORY=FILE`` each module's peak resident memory (sampled every 20 ms while the module runs), its
resident memory after the release, and its wall seconds are appended to ``FILE`` as one JSON line per module
(MiB), which is how docs/reliability.md's "Test-suite memory" figures are made.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from toolgym.resources import current_rss_mb, release_memory

_RECORD = os.environ.get("TOOLGYM_TEST_MEMORY")
_state: dict[str, Any] = {}


class _Sampler:
    """The largest ``VmRSS`` (MiB) seen while it runs, sampled by a daemon thread."""

    def __init__(self, interval_s: float = 0.02) -> None:
        import threading

        self.peak = current_rss_mb() or 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True, name="test-rss-sampler")
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.peak = max(self.peak, current_rss_mb() or 0.0)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, current_rss_mb() or 0.0)


def _clear_test_caches() -> None:
    """Empty the ``functools.cache`` of every tokenizer builder in ``tests/tokenizers.py`` (when imported)."""
    import sys

    module = sys.modules.get("tests.tokenizers")
    for value in vars(module).values() if module is not None else ():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()


def _module_of(item: pytest.Item | None) -> str | None:
    return None if item is None else item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _RECORD and _state.get("module") != _module_of(item):
        _state.update(module=_module_of(item), sampler=_Sampler(), t0=time.perf_counter())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the module's fixtures end here when the next test is in another module
    if _module_of(nextitem) == _module_of(item):
        return
    _clear_test_caches()
    release_memory()
    sampler = _state.pop("sampler", None)
    if _RECORD and sampler is not None:
        row = {"module": _module_of(item), "peak_rss_mb": round(sampler.stop(), 1),
               "rss_after_mb": round(current_rss_mb() or 0.0, 1),
               "wall_s": round(time.perf_counter() - _state.get("t0", time.perf_counter()), 1)}
        with open(_RECORD, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    _state.pop("module", None)
