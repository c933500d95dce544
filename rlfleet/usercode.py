"""User code (reward functions, tools, environment responses): found by name, called by name,
contained.

A reference is `path/to/file.py:name` or `package.module:name`. Arguments are injected by
parameter name, as TRL's and verifiers' reward functions get them; a function that takes
`**kwargs` gets everything. Sync functions run on a daemon thread, so one that hangs costs its
timeout and a thread, never the step or the process's exit; async functions are awaited with
the same timeout (an async function must not block its event loop).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


class UserCodeError(ValueError):
    """A reference that does not resolve to a callable (preflight reports it naming the field)."""


def load_object(ref: str) -> Any:
    """The object `ref` names: `file.py:name` (relative to the cwd) or `module:name`."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise UserCodeError(f"{ref!r} is not `path/to/file.py:name` or `module:name`")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise UserCodeError(f"{ref!r}: no file {path}")
        module = _load_file(path)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise UserCodeError(f"{ref!r}: cannot import {target!r}: {e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UserCodeError(f"{ref!r}: {target} has no attribute {attr!r}") from None


def _load_file(path: Path) -> Any:
    """Import a file once per process under a name derived from its path."""
    name = f"rlfleet_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as e:
        del sys.modules[name]
        raise UserCodeError(f"{path}: importing it raised {type(e).__name__}: {e}") from None
    return module


@contextmanager
def field(name: str) -> Iterator[None]:
    """Prefix a loading error with the config field it comes from."""
    try:
        yield
    except Exception as e:
        msg = str(e) if isinstance(e, UserCodeError | ValueError) else f"{type(e).__name__}: {e}"
        raise UserCodeError(f"{name}: {msg}") from None


class UserFn:
    """A loaded user function: which arguments it takes, and a contained call."""

    def __init__(self, ref: str):
        self.ref = ref
        fn = load_object(ref)
        if not callable(fn):
            raise UserCodeError(f"{ref!r} is not callable")
        self.fn: Callable[..., Any] = fn
        self.name = getattr(fn, "__name__", ref.rpartition(":")[2])
        params = inspect.signature(fn).parameters.values()
        self.takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.params = {p.name for p in named}
        self.required = {p.name for p in named if p.default is p.empty}
        self.is_async = inspect.iscoroutinefunction(fn)

    def missing(self, available: set[str]) -> list[str]:
        """Required parameters nothing would fill (checked in preflight, not at the first call)."""
        return sorted(self.required - available)

    async def __call__(self, timeout_s: float, **available: Any) -> Any:
        kwargs = available if self.takes_all else {k: v for k, v in available.items() if k in self.params}
        if self.is_async:
            return await asyncio.wait_for(self.fn(**kwargs), timeout_s)
        return await asyncio.wait_for(on_daemon_thread(self.fn, kwargs, self.name), timeout_s)


def on_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any], name: str) -> asyncio.Future:
    """Run `fn` on a daemon thread: a call that never returns cannot block the interpreter's exit
    (an executor's worker threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.done():  # timed out and cancelled meanwhile
            return
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)

    def target() -> None:
        try:
            value, exc = fn(**kwargs), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            value, exc = None, e
        with suppress(RuntimeError):  # the loop closed while we ran: nobody is waiting any more
            loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=target, name=f"usercode:{name}", daemon=True).start()
    return fut


def describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"
