"""toolgym.resources: per-phase peaks are measured without resetting the process's high-water mark, so what
``/usr/bin/time -v`` (getrusage) reports for a run that uses :class:`Phases` is still the run's real peak."""

from __future__ import annotations

import resource
import sys
import time

import numpy as np
import pytest

from toolgym.resources import Phases, current_rss_mb, peak_rss_mb, trim_heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or current_rss_mb() is None,
                                reason="reads /proc/self/status")


def test_phase_peaks_see_a_transient_allocation_and_leave_the_process_peak_alone():
    phases = Phases()
    with phases("big"):
        a = np.ones(300 * 2**20 // 8)  # 300 MiB, touched
        time.sleep(0.05)
        del a
        trim_heap()
    with phases("small"):
        time.sleep(0.05)
    d = phases.to_dict()
    big, small = d["phases"]["big"]["peak_rss_mb"], d["phases"]["small"]["peak_rss_mb"]
    assert big >= small + 250, (big, small)
    # the kernel's high-water mark was not reset: getrusage (what /usr/bin/time -v prints, KiB) still holds the
    # transient peak after both phases ended
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    assert maxrss_mb >= big - 5
    assert peak_rss_mb() >= big - 5
    assert d["peak_rss_mb"] >= big - 5


def test_trim_heap_reports_whether_it_ran():
    import platform

    assert trim_heap() is (platform.libc_ver()[0] == "glibc")
