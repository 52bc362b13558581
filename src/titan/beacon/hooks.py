"""One DDP comm hook, many observers.

DDP accepts exactly one communication hook per model. The guard owns it (it must see each
bucket before the all-reduce); tracing and the beacon's collective counters only observe.
Observers register a wrapper here, and whoever registers the hook registers
``wrap_comm_hook(hook)``: every wrapper sees each bucket's call and its future.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["add_comm_hook_wrapper", "remove_comm_hook_wrapper", "wrap_comm_hook"]

Hook = Callable[[Any, Any], Any]
_WRAPPERS: list[Callable[[Hook], Hook]] = []


def add_comm_hook_wrapper(wrapper: Callable[[Hook], Hook]) -> None:
    """Register ``wrapper(hook) -> hook``; applied to hooks registered from now on."""
    if wrapper not in _WRAPPERS:
        _WRAPPERS.append(wrapper)


def remove_comm_hook_wrapper(wrapper: Callable[[Hook], Hook]) -> None:
    if wrapper in _WRAPPERS:
        _WRAPPERS.remove(wrapper)


def wrap_comm_hook(hook: Hook) -> Hook:
    """``hook`` wrapped by every registered observer (outermost: the first registered)."""
    for w in reversed(_WRAPPERS):
        hook = w(hook)
    return hook
