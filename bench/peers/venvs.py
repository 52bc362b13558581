"""Each peer in its own virtual environment under ``.venv-peers/<name>`` (gitignored).

``pip install torch==2.13.0`` takes the local CPU wheel; the peer is then installed with
``-c .venv-peers/constraints.txt`` (``torch==2.13.0``) so that nothing upgrades or
downgrades torch. Versions are recorded in ``.venv-peers/<name>/versions.json``.

    python bench/peers/venvs.py --build            # every peer (about 2 min here)
    python bench/peers/venvs.py --build torchft    # one
    python bench/peers/venvs.py                    # status only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV_ROOT = Path(os.environ.get("PEERS_VENV_ROOT", ROOT / ".venv-peers"))
TORCH = "torch==2.13.0"

__all__ = ["ROOT", "VENV_ROOT", "build", "load_config", "python_for", "status"]


def load_config(name: str) -> dict[str, Any]:
    """``bench/peers/configs/<name>.toml``."""
    with open(HERE / "configs" / f"{name}.toml", "rb") as f:
        return tomllib.load(f)


def python_for(cfg: dict[str, Any]) -> Path:
    """The interpreter of a system's environment (``main``: the project's own .venv)."""
    if cfg["venv"] == "main":
        main = ROOT / ".venv" / "bin" / "python"
        return main if main.exists() else Path(sys.executable)
    return VENV_ROOT / cfg["venv"] / "bin" / "python"


def status(cfg: dict[str, Any]) -> dict[str, Any]:
    """``{"ok": bool, "reason": str | None, "versions": {...}}`` without building anything."""
    if cfg["venv"] == "main":
        return {"ok": True, "reason": None, "versions": _versions(python_for(cfg), ["torch", "titan-resilience"])}
    py = python_for(cfg)
    rec = VENV_ROOT / cfg["venv"] / "versions.json"
    if not py.exists() or not rec.exists():
        return {"ok": False, "reason": f"no environment at {py.parent.parent} (python bench/peers/venvs.py --build "
                                        f"{cfg['venv']})", "versions": {}}
    return {"ok": True, "reason": None, "versions": json.loads(rec.read_text())}


def _versions(py: Path, dists: list[str]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for d in sys.argv[1:]:\n"
            "    try: out[d] = m.version(d)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    r = subprocess.run([str(py), "-c", code, *dists], capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def build(cfg: dict[str, Any], log: Path | None = None) -> dict[str, Any]:
    """Create the environment if missing; returns :func:`status`. Cost: ~20-60 s per peer.

    Raises ``RuntimeError`` (with the pip log's tail) when an install fails.
    """
    if cfg["venv"] == "main" or status(cfg)["ok"]:
        return status(cfg)
    env_dir = VENV_ROOT / cfg["venv"]
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    constraints = VENV_ROOT / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    log = log or VENV_ROOT / f"{cfg['venv']}.log"
    t0 = time.monotonic()
    steps = [[sys.executable if sys.version_info[:2] == (3, 11) else "python3", "-m", "venv", "--clear", str(env_dir)]]
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q"]
    if cfg.get("torch", True):
        steps.append(pip + [TORCH])
    steps.append(pip + ["-c", str(constraints), *cfg["packages"]])
    if cfg.get("import"):
        steps.append([str(env_dir / "bin" / "python"), "-c", f"import {cfg['import']}"])
    with open(log, "w") as out:
        for cmd in steps:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode:
                tail = log.read_text()[-1500:]
                raise RuntimeError(f"building {env_dir} failed at: {' '.join(cmd)}\n{tail}")
    dists = ["torch", *[p.split("==")[0].split(">")[0].split("<")[0].strip() for p in cfg["packages"]]]
    versions = _versions(env_dir / "bin" / "python", dists)
    if cfg.get("torch", True) and versions.get("torch", "").split("+")[0] != TORCH.split("==")[1]:
        raise RuntimeError(f"{env_dir}: torch is {versions.get('torch')}, expected {TORCH}")
    versions["_built_s"] = round(time.monotonic() - t0, 1)
    (env_dir / "versions.json").write_text(json.dumps(versions, indent=1))
    return status(cfg)


PEERS = ("torchft", "nvrx", "lm_resiliency", "goodput")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", default=list(PEERS))
    ap.add_argument("--build", action="store_true", help="create the missing environments")
    a = ap.parse_args(argv)
    rc = 0
    for name in a.names:
        cfg = load_config(name)
        try:
            st = build(cfg) if a.build else status(cfg)
        except RuntimeError as e:
            print(f"{name}: FAILED {e}", file=sys.stderr)
            rc = 1
            continue
        print(f"{name}: {'ok ' + json.dumps(st['versions']) if st['ok'] else st['reason']}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
