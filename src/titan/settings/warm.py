"""Settings of warm workers (``titan.warm``: a zygote that forks workers with imports loaded)."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require

__all__ = ["WarmConfig"]


@register_section("warm")
@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmConfig:
    """With ``enabled``, ``titan run`` starts one zygote per node before any worker: a process that has
    imported torch, Titan's in-process library and the script's own top-level imports, and
    forks a worker whenever torchrun's agent starts one (a restart costs a fork instead of
    Python + ``import torch``). Any problem (zygote not ready in ``ready_timeout_s``, dead,
    CUDA initialised by an import) falls back to torchrun's cold spawn and says so in
    ``worker.started`` (``spawn``)."""

    #: Off by default; ``--set warm.enabled=true`` or ``TITAN_WARM_ENABLED=1`` turns it on.
    enabled: bool = False
    #: How long a worker start waits for the zygote to finish importing before it starts cold.
    ready_timeout_s: float = 300.0
    #: Extra modules the zygote imports (comma-separated), beside torch, Titan's library and
    #: the script's top-level imports.
    preload: str = ""
    #: Import the training script's own top-level imports in the zygote (read with ``ast``).
    preload_script_imports: bool = True
    #: A zygote that died is started again at most this many times per ``titan run``.
    max_respawns: int = 3

    def __post_init__(self) -> None:
        require(self.ready_timeout_s > 0, "warm.ready_timeout_s must be > 0", "e.g. 300")
        require(self.max_respawns >= 0, "warm.max_respawns must be >= 0", "e.g. 3")
        for name in (m.strip() for m in self.preload.split(",")):
            require(not name or all(p.isidentifier() for p in name.split(".")),
                    f"warm.preload: {name!r} is not a module name", "e.g. warm.preload = \"transformers,datasets\"")
