"""toolgym.batching.MicroBatcher: batching happens, errors reach every waiter, no waiter hangs."""

from __future__ import annotations

import asyncio

import pytest

from toolgym.batching import MicroBatcher

pytestmark = pytest.mark.timeout(30)


class Recorder:
    """A batched function that records each call's items (and can be told to fail or to take time)."""

    def __init__(self, *, delay: float = 0.0, fail: BaseException | None = None) -> None:
        self.calls: list[list[int]] = []
        self.delay, self.fail = delay, fail
        self.running = self.max_running = 0

    async def __call__(self, items: list[int]) -> list[int]:
        self.calls.append(list(items))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail is not None:
                raise self.fail
            return [x * 10 for x in items]
        finally:
            self.running -= 1


async def test_concurrent_submits_share_one_call_and_get_their_own_results():
    fn = Recorder()
    b = MicroBatcher(fn)
    got = await asyncio.gather(*(b.submit(i) for i in range(20)))
    assert got == [i * 10 for i in range(20)]
    assert fn.calls == [list(range(20))]
    assert b.batches == 1


async def test_serial_batches_form_while_the_previous_call_runs():
    fn = Recorder(delay=0.05)
    b = MicroBatcher(fn)

    async def later(i: int) -> int:
        await asyncio.sleep(0.01)  # arrives while the first batch is running
        return await b.submit(i)

    got = await asyncio.gather(b.submit(0), b.submit(1), *(later(i) for i in range(2, 6)))
    assert got == [0, 10, 20, 30, 40, 50]
    assert fn.calls == [[0, 1], [2, 3, 4, 5]]
    assert fn.max_running == 1  # never two calls at once


async def test_max_batch_splits_and_concurrent_mode_overlaps():
    fn = Recorder(delay=0.05)
    b = MicroBatcher(fn, max_batch=3, concurrent=True)
    got = await asyncio.gather(*(b.submit(i) for i in range(7)))
    assert got == [i * 10 for i in range(7)]
    assert fn.calls == [[0, 1, 2], [3, 4, 5], [6]]
    assert fn.max_running >= 2  # the batches overlapped


async def test_window_gathers_items_arriving_within_it():
    fn = Recorder()
    b = MicroBatcher(fn, max_wait_s=0.2)

    async def at(t: float, i: int) -> int:
        await asyncio.sleep(t)
        return await b.submit(i)

    await asyncio.gather(at(0.0, 0), at(0.05, 1), at(0.1, 2))
    assert fn.calls == [[0, 1, 2]]


async def test_a_full_batch_does_not_wait_for_the_window():
    fn = Recorder()
    b = MicroBatcher(fn, max_batch=4, max_wait_s=30.0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await asyncio.gather(*(b.submit(i) for i in range(4))) == [0, 10, 20, 30]
    assert loop.time() - t0 < 5.0


async def test_an_exception_reaches_every_waiter_and_the_batcher_keeps_working():
    fn = Recorder(fail=ValueError("boom"))
    b = MicroBatcher(fn)
    results = await asyncio.gather(*(b.submit(i) for i in range(5)), return_exceptions=True)
    assert all(isinstance(r, ValueError) and str(r) == "boom" for r in results)
    fn.fail = None
    assert await b.submit(7) == 70


async def test_per_item_exceptions_and_wrong_result_counts():
    async def half(items: list[int]) -> list[object]:
        return [KeyError(x) if x % 2 else x for x in items]

    b = MicroBatcher(half)
    results = await asyncio.gather(*(b.submit(i) for i in range(4)), return_exceptions=True)
    assert results[0] == 0 and results[2] == 2
    assert isinstance(results[1], KeyError) and isinstance(results[3], KeyError)

    async def short(items: list[int]) -> list[int]:
        return items[:-1]

    b2 = MicroBatcher(short)
    results = await asyncio.gather(*(b2.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "2 results for 3 items" in str(r) for r in results)


async def test_a_cancelled_waiter_leaves_its_batch():
    fn = Recorder()
    b = MicroBatcher(fn, max_wait_s=0.1)
    t = asyncio.ensure_future(b.submit(1))
    keep = asyncio.ensure_future(b.submit(2))
    await asyncio.sleep(0.01)
    t.cancel()
    assert await keep == 20
    assert fn.calls == [[2]]


async def test_no_waiter_hangs_when_the_batcher_is_closed_mid_call():
    started = asyncio.Event()

    async def forever(items: list[int]) -> list[int]:
        started.set()
        await asyncio.sleep(3600)
        return items

    b = MicroBatcher(forever)
    waiters = [asyncio.ensure_future(b.submit(i)) for i in range(3)]
    await started.wait()
    late = asyncio.ensure_future(b.submit(9))  # queued behind the running call
    await asyncio.sleep(0)
    await asyncio.wait_for(b.aclose(), 5)
    for w in [*waiters, late]:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(w, 5)
    with pytest.raises(RuntimeError, match="closed"):
        await b.submit(1)


def test_a_batcher_is_bound_to_one_loop():
    b: MicroBatcher[int, int] = MicroBatcher(Recorder())
    assert asyncio.run(b.submit(1)) == 10
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(b.submit(2))


def test_bad_arguments():
    with pytest.raises(ValueError):
        MicroBatcher(Recorder(), max_batch=0)
    with pytest.raises(ValueError):
        MicroBatcher(Recorder(), max_wait_s=-1)
