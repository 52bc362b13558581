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

__all__ = ["FaultSpec", "Plan", "KINDS", "IN_PROCESS_KINDS", "CHOICES", "RANGES"]

#: kind → (parameters with defaults). ``rank``/``step``/``node`` are common to all.
KINDS: dict[str, dict[str, Any]] = {
    "nan_grad": {"param": "", "value": "nan", "times": 1},
    "inf_loss": {"times": 1},
    "spike": {"factor": 3.0, "times": 1},
    # dtype "": flip bit ``bit`` of whatever the tensor holds; else the tensor must hold that
    # dtype (a bit drawn for bf16's layout means another class in fp32).
    "bitflip": {"target": "param", "tensor": "", "index": 0, "bit": 0, "seed": 0, "dtype": ""},
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
    # A whole node (launcher, workers, node agent) SIGKILLed and its checkpoint folder deleted;
    # a replacement starts with an empty folder (``titan drill --nodes 2 --node-local``).
    "node_loss": {},
}
#: Allowed values of the parameters that name a choice (others are checked by type).
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("hang", "where"): ("collective", "gil", "data"),
    ("exception", "what"): ("cuda", "comm"),
    ("bitflip", "dtype"): ("", "float32", "bfloat16", "float16", "float64"),
    ("net", "what"): ("loss", "bandwidth", "delay", "partition", "partition_long"),
    ("disk", "what"): ("enospc", "slow_fsync", "corrupt", "truncate"),
    ("stress", "what"): ("cpu", "vm"),
}
#: (lo, hi) of the numeric parameters (seconds at most a day: a drill is bounded).
RANGES: dict[str, tuple[float, float]] = {
    # index -1: a random element (bitflip, drawn with its seed); workers 0: sized to the machine (stress)
    "times": (1, 1_000_000), "factor": (1e-6, 1e6), "index": (-1, 2**62), "bit": (0, 63), "seconds": (0, 86400),
    "steps": (1, 1_000_000), "percent": (0, 100), "delay_ms": (0, 60_000), "workers": (0, 256),
    "seed": (0, 2**62),
}
MAX_STEP = 100_000_000
MAX_RANK = 1_000_000

#: Kinds applied inside the worker process (the rest are applied from outside).
IN_PROCESS_KINDS = frozenset({"nan_grad", "inf_loss", "spike", "bitflip", "gemm_perturb", "hang", "slow",
                              "exception", "poison_sample"})


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    """One fault: ``kind`` at optimizer step ``step`` on ``rank`` (``None``: every rank).

    ``survive_only``: the reason this fault is only to be survived, not detected (the verdict
    then does not require a detector; docs/chaos.md lists the built-in plans' marks).
    """

    kind: str
    step: int
    rank: int | None = None
    node: str | None = None
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    survive_only: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise UserError(f"unknown fault kind {self.kind!r}", f"kinds: {', '.join(sorted(KINDS))}")
        if not _is_int(self.step) or not 1 <= self.step <= MAX_STEP:
            raise UserError(f"fault {self.kind}: step must be a whole number within 1 … {MAX_STEP:,}, got {self.step!r}",
                            "steps are 1-based optimizer steps, e.g. step = 40")
        if self.rank is not None and (not _is_int(self.rank) or not 0 <= self.rank <= MAX_RANK):
            raise UserError(f"fault {self.kind} at step {self.step}: rank must be a whole number >= 0, got {self.rank!r}",
                            "ranks count from 0; omit rank for every rank")
        if self.node is not None:
            from titan.inputs import check_id

            if not isinstance(self.node, str):
                raise UserError(f"fault {self.kind} at step {self.step}: node must be a node id, got {self.node!r}",
                                "e.g. node = \"node1\"")
            check_id(self.node, f"node id of fault {self.kind} at step {self.step}")
        if self.survive_only is not None and not (isinstance(self.survive_only, str) and self.survive_only.strip()):
            raise UserError(f"fault {self.kind}: survive_only must be the reason, as a non-empty string",
                            'e.g. survive_only = "shorter than any detector can see"')
        unknown = set(self.params) - set(KINDS[self.kind])
        if unknown:
            raise UserError(f"fault {self.kind}: unknown parameter(s) {', '.join(sorted(unknown))}",
                            f"parameters of {self.kind}: {', '.join(sorted(KINDS[self.kind])) or 'none'}")
        for key, value in self.params.items():
            _check_param(self.kind, self.step, key, value)

    def get(self, key: str) -> Any:
        return self.params.get(key, KINDS[self.kind][key])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "step": self.step}
        if self.rank is not None:
            d["rank"] = self.rank
        if self.node is not None:
            d["node"] = self.node
        if self.survive_only is not None:
            d["survive_only"] = self.survive_only
        d.update(self.params)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FaultSpec":
        if not isinstance(d, Mapping):
            raise UserError(f"a fault must be a table, got {d!r}", "write [[faults]] tables with kind, step, rank")
        d = dict(d)
        try:
            kind, step = d.pop("kind"), d.pop("step")
        except KeyError as e:
            raise UserError(f"a fault needs {e.args[0]!r}", "e.g. {kind = \"nan_grad\", rank = 1, step = 40}") from None
        return cls(kind=kind, step=step, rank=d.pop("rank", None), node=d.pop("node", None),
                   survive_only=d.pop("survive_only", None), params=d)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_param(kind: str, step: int, key: str, value: Any) -> None:
    """One parameter against its default's type, its choices and its range (``UserError``)."""
    import math
    import signal

    where = f"fault {kind} at step {step}: {key}"
    default = KINDS[kind][key]
    if isinstance(default, str):
        if not isinstance(value, str):
            raise UserError(f"{where} must be a string, got {value!r}", f"e.g. {key} = {json.dumps(default)}")
        choices = CHOICES.get((kind, key))
        if choices and value not in choices:
            raise UserError(f"{where} = {value!r} is not one of {', '.join(choices)}", f"use one of {', '.join(choices)}")
        if key == "signal" and (not value.startswith("SIG") or not hasattr(signal, value) or value.startswith("SIG_")):
            raise UserError(f"{where} = {value!r} is not a signal name", "e.g. SIGKILL, SIGTERM, SIGSEGV")
        if kind == "nan_grad" and key == "value":
            try:
                float(value)
            except ValueError:
                raise UserError(f"{where} = {value!r} is not a number", "use \"nan\", \"inf\" or a number") from None
        return
    if isinstance(default, int):
        ok = _is_int(value)
    else:  # float: an int is fine too, a bool or a string is not
        ok = _is_int(value) or (isinstance(value, float) and math.isfinite(value))
    lo, hi = RANGES.get(key, (-1e12, 1e12))
    if not ok or not lo <= value <= hi:
        what = "a whole number" if isinstance(default, int) else "a finite number"
        raise UserError(f"{where} must be {what} within {lo:g} … {hi:g}, got {value!r}", f"e.g. {key} = {default!r}")


class Plan:
    """An ordered list of faults, built fluently or loaded from a file."""

    def __init__(self, faults: list[FaultSpec] | None = None, name: str = "custom") -> None:
        self.faults: list[FaultSpec] = list(faults or [])
        self.name = name

    def add(self, kind: str, *, step: int, rank: int | None = None, node: str | None = None,
            survive_only: str | None = None, **params: Any) -> "Plan":
        self.faults.append(FaultSpec(kind=kind, step=step, rank=rank, node=node, params=params,
                                     survive_only=survive_only))
        return self

    # Fluent helpers, one per kind (all forward to ``add``).
    def nan_grad(self, *, rank: int, step: int, param: str = "", **kw: Any) -> "Plan":
        return self.add("nan_grad", rank=rank, step=step, param=param, **kw)

    def inf_loss(self, *, rank: int, step: int, **kw: Any) -> "Plan":
        return self.add("inf_loss", rank=rank, step=step, **kw)

    def spike(self, *, rank: int, step: int, factor: float = 3.0, **kw: Any) -> "Plan":
        return self.add("spike", rank=rank, step=step, factor=factor, **kw)

    def bitflip(self, *, rank: int, step: int, target: str = "param", tensor: str = "", index: int = 0,
                bit: int = 0, seed: int = 0, dtype: str = "") -> "Plan":
        """``tensor="*"`` / ``index=-1``: the rank draws the element with ``seed`` when it flips;
        ``dtype`` (e.g. ``"bfloat16"``): the tensor must hold that dtype (else the worker refuses)."""
        return self.add("bitflip", rank=rank, step=step, target=target, tensor=tensor, index=index, bit=bit,
                        seed=seed, **({"dtype": dtype} if dtype else {}))

    def gemm_perturb(self, *, rank: int, step: int) -> "Plan":
        return self.add("gemm_perturb", rank=rank, step=step)

    def kill(self, *, rank: int, step: int, signal: str = "SIGKILL") -> "Plan":
        return self.add("kill", rank=rank, step=step, signal=signal)

    def stop(self, *, rank: int, step: int) -> "Plan":
        """SIGSTOP one rank at the start of ``step``: a hang the rank cannot report itself
        (the watchdog must find it, name the rank and its phase, and restart the group)."""
        return self.add("kill", rank=rank, step=step, signal="SIGSTOP")

    def hang(self, *, rank: int, step: int, where: str = "collective", seconds: float = 3600.0) -> "Plan":
        return self.add("hang", rank=rank, step=step, where=where, seconds=seconds)

    def slow(self, *, rank: int, step: int, factor: float = 2.0, steps: int = 50) -> "Plan":
        return self.add("slow", rank=rank, step=step, factor=factor, steps=steps)

    def exception(self, *, rank: int, step: int, what: str = "cuda") -> "Plan":
        return self.add("exception", rank=rank, step=step, what=what)

    def preempt(self, *, step: int) -> "Plan":
        return self.add("preempt", step=step)

    def node_loss(self, *, step: int, node: str = "node1") -> "Plan":
        """Lose ``node`` (processes and disk) at ``step``; a replacement with an empty folder joins."""
        self.faults.append(FaultSpec(kind="node_loss", step=step, node=node))
        return self

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
        from titan.inputs import read_text_file

        p = Path(path)
        text = read_text_file(p, "fault plan", "give a TOML, YAML or JSON plan file (see docs/chaos.md)")
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
