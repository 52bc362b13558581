"""Fault plans: what to break, where and when — as a fluent API and as a TOML/YAML file.

    plan = Plan().nan_grad(rank=1, step=40, param="blocks.0.attn.qkv.weight").kill(rank=0, step=90)
    plan.save("plan.toml");  Plan.load("plan.toml")

A plan is data; ``titan.chaos.worker`` applies the in-process kinds inside the ranks (drills
hand the plan over with ``TITAN_CHAOS_PLAN``) and the drill driver applies the OS-level
kinds from outside. Every kind and its parameters are validated when the plan is built.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Mapping

from titan.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["FaultSpec", "Plan", "KINDS", "IN_PROCESS_KINDS"]

#: kind → (parameters with defaults). ``rank``/``step``/``node`` are common to all.
KINDS: dict[str, dict[str, Any]] = {
    "nan_grad": {"param": "", "value": "nan", "times": 1},
    "inf_loss": {"times": 1},
    "spike": {"factor": 3.0, "times": 1},
    "bitflip": {"target": "param", "tensor": "", "index": 0, "bit": 0},
    "gemm_perturb": {},
    "kill": {"signal": "SIGKILL"},
    "hang": {"where": "collective", "seconds": 3600.0},
    "slow": {"factor": 2.0, "steps": 50},
    "exception": {"what": "cuda"},
    "preempt": {},
    "net": {"what": "loss", "percent": 1.0, "rate": "5mbit", "delay_ms": 50.0, "seconds": 10.0},
    "disk": {"what": "enospc", "seconds": 0.5},
    "stress": {"what": "cpu", "workers": 2, "seconds": 10.0},
    "poison_sample": {"index": 0},
}
#: Kinds applied inside the worker process (the rest are applied from outside).
IN_PROCESS_KINDS = frozenset({"nan_grad", "inf_loss", "spike", "bitflip", "gemm_perturb", "hang", "slow",
                              "exception", "poison_sample"})


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    """One fault: ``kind`` at optimizer step ``step`` on ``rank`` (``None``: every rank)."""

    kind: str
    step: int
    rank: int | None = None
    node: str | None = None
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"unknown fault kind {self.kind!r}", f"kinds: {', '.join(sorted(KINDS))}")
        if not isinstance(self.step, int) or self.step < 1:
            raise UserError(f"fault {self.kind}: step must be an integer >= 1, got {self.step!r}",
                            "steps are 1-based optimizer steps")
        unknown = set(self.params) - set(KINDS[self.kind])
        if unknown:
            raise UserError(f"fault {self.kind}: unknown parameter(s) {', '.join(sorted(unknown))}",
                            f"parameters of {self.kind}: {', '.join(sorted(KINDS[self.kind])) or 'none'}")

    def get(self, key: str) -> Any:
        return self.params.get(key, KINDS[self.kind][key])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "step": self.step}
        if self.rank is not None:
            d["rank"] = self.rank
        if self.node is not None:
            d["node"] = self.node
        d.update(self.params)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FaultSpec":
        d = dict(d)
        try:
            kind, step = d.pop("kind"), d.pop("step")
        except KeyError as e:
            raise UserError(f"a fault needs {e.args[0]!r}", "e.g. {kind = \"nan_grad\", rank = 1, step = 40}") from None
        return cls(kind=kind, step=step, rank=d.pop("rank", None), node=d.pop("node", None), params=d)


class Plan:
    """An ordered list of faults, built fluently or loaded from a file."""

    def __init__(self, faults: list[FaultSpec] | None = None, name: str = "custom") -> None:
        self.faults: list[FaultSpec] = list(faults or [])
        self.name = name

    def add(self, kind: str, *, step: int, rank: int | None = None, node: str | None = None, **params: Any) -> "Plan":
        self.faults.append(FaultSpec(kind=kind, step=step, rank=rank, node=node, params=params))
        return self

    # Fluent helpers, one per kind (all forward to ``add``).
    def nan_grad(self, *, rank: int, step: int, param: str = "", **kw: Any) -> "Plan":
        return self.add("nan_grad", rank=rank, step=step, param=param, **kw)

    def inf_loss(self, *, rank: int, step: int, **kw: Any) -> "Plan":
        return self.add("inf_loss", rank=rank, step=step, **kw)

    def spike(self, *, rank: int, step: int, factor: float = 3.0, **kw: Any) -> "Plan":
        return self.add("spike", rank=rank, step=step, factor=factor, **kw)

    def bitflip(self, *, rank: int, step: int, target: str = "param", tensor: str = "", index: int = 0,
                bit: int = 0) -> "Plan":
        return self.add("bitflip", rank=rank, step=step, target=target, tensor=tensor, index=index, bit=bit)

    def gemm_perturb(self, *, rank: int, step: int) -> "Plan":
        return self.add("gemm_perturb", rank=rank, step=step)

    def kill(self, *, rank: int, step: int, signal: str = "SIGKILL") -> "Plan":
        return self.add("kill", rank=rank, step=step, signal=signal)

    def hang(self, *, rank: int, step: int, where: str = "collective", seconds: float = 3600.0) -> "Plan":
        return self.add("hang", rank=rank, step=step, where=where, seconds=seconds)

    def slow(self, *, rank: int, step: int, factor: float = 2.0, steps: int = 50) -> "Plan":
        return self.add("slow", rank=rank, step=step, factor=factor, steps=steps)

    def exception(self, *, rank: int, step: int, what: str = "cuda") -> "Plan":
        return self.add("exception", rank=rank, step=step, what=what)

    def preempt(self, *, step: int) -> "Plan":
        return self.add("preempt", step=step)

    def poison_sample(self, *, step: int, index: int = 0) -> "Plan":
        return self.add("poison_sample", step=step, index=index)

    def for_rank(self, rank: int, node: str | None = None) -> list[FaultSpec]:
        """The in-process faults this rank must apply."""
        return [f for f in self.faults if f.kind in IN_PROCESS_KINDS and (f.rank is None or f.rank == rank)
                and (f.node is None or node is None or f.node == node)]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "faults": [f.to_dict() for f in self.faults]}

    def save(self, path: str | Path) -> Path:
        """Write as JSON (``.json``) or TOML (anything else)."""
        p = Path(path)
        if p.suffix == ".json":
            p.write_text(json.dumps(self.to_dict(), indent=2))
        else:
            lines = [f'name = "{self.name}"', ""]
            for f in self.faults:
                lines.append("[[faults]]")
                for k, v in f.to_dict().items():
                    lines.append(f"{k} = {json.dumps(v)}")
                lines.append("")
            p.write_text("\n".join(lines))
        return p

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        faults = d.get("faults", [])
        if not isinstance(faults, list):
            raise UserError("'faults' must be a list of tables", "write [[faults]] tables")
        return cls([FaultSpec.from_dict(f) for f in faults], name=str(d.get("name", "custom")))

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """Read a plan from TOML, YAML (``.yaml``/``.yml``, needs PyYAML) or JSON."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise UserError(f"cannot read fault plan {p}: {e.strerror or e}", "check the path") from None
        try:
            if p.suffix == ".json":
                data = json.loads(text)
            elif p.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text) or {}
            else:
                data = tomllib.loads(text)
        except Exception as e:  # noqa: BLE001 - any parse error is the user's file
            raise UserError(f"fault plan {p} does not parse: {e}", "see docs/chaos.md for the format") from None
        if not isinstance(data, dict):
            raise UserError(f"fault plan {p} must be a table", "see docs/chaos.md for the format")
        return cls.from_dict(data)
