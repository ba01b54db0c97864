"""What the asyncio modules and their generated sync twins cannot share by rewriting
(running calls side by side, and calling a callback that may be a coroutine function),
so both versions are written here by hand.

The async modules call `async_run_concurrently` and `async_notify`; scripts/unasync.py
renames them to `run_concurrently` and `notify` in the sync modules it generates. Keep
each pair in step.
"""
from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

__all__ = ["async_run_concurrently", "run_concurrently", "async_notify", "notify"]

T = TypeVar("T")


async def async_run_concurrently(fn: Callable[[T], Awaitable[None]], items: Sequence[T], limit: int,
                                 name: str) -> None:
    """Awaits fn(item) for every item, at most `limit` at a time, in tasks named after `name`.

    The first failure (or the caller's cancellation) cancels the other calls, waits for
    them to end, and is raised.
    """
    pending = iter(items)

    async def worker() -> None:
        for item in pending:  # shared: each worker takes the next item not yet started
            await fn(item)

    tasks = [asyncio.create_task(worker(), name=f"{name}-{i}") for i in range(min(limit, len(items)))]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def run_concurrently(fn: Callable[[T], None], items: Sequence[T], limit: int, name: str) -> None:
    """Calls fn(item) for every item, at most `limit` at a time, in threads named after `name`
    (in this thread when one at a time is all there is to do).

    The first failure cancels the calls not yet started, waits for those running, and is
    raised.
    """
    workers = min(limit, len(items))
    if workers <= 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for f in as_completed(futures):
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise  # leaving the block waits for the calls in flight


async def async_notify(handler: Callable[[T], object] | None, value: T) -> None:
    """Calls a callback with value, awaiting what it returns if it is awaitable (so a
    plain function and a coroutine function both work)."""
    if handler is None:
        return
    outcome = handler(value)
    if inspect.isawaitable(outcome):
        await outcome


def notify(handler: Callable[[T], object] | None, value: T) -> None:
    """Calls a callback with value (the sync twin of `async_notify`)."""
    if handler is not None:
        handler(value)
