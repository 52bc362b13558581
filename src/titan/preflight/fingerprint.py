"""A node's software and hardware fingerprint (no collectives; torch imported lazily).

What goes in is what makes two nodes compute or communicate differently: Python, torch and
its CUDA/cuDNN/NCCL builds, the driver and GPUs (NVML), CPU model and ISA flags, kernel,
thread settings, a list of Python packages, ``NCCL_*``/``TORCH_*``/``CUDA_*`` variables and
the container image digest when the recipe exports it (``TITAN_IMAGE_DIGEST``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import platform
import sys
from typing import Any, Iterable, Mapping

__all__ = ["collect_fingerprint", "flatten", "DEFAULT_PACKAGES", "ENV_PREFIXES", "VOLATILE_KEYS", "compute_group_key"]

DEFAULT_PACKAGES = ("mpi4py", "numpy", "transformers", "deepspeed", "accelerate")
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_")
#: Keys that differ between healthy nodes by design; shown, never compared.
VOLATILE_KEYS = frozenset({"host.hostname", "host.pid"})
# Variables that torchrun sets per worker or per run; they are not part of the stack.
_ENV_IGNORE = frozenset({"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                         "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                         "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_ENABLE_FILE_TIMER", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"})


def _cpu() -> dict[str, Any]:
    model, flags = platform.processor() or "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and not model.strip():
                    model = val.strip()
                elif key == "model name":
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = val.strip()
                if model and flags:
                    break
    except OSError:
        pass
    isa = sorted(f for f in flags.split() if f.startswith(("avx", "sse", "fma", "amx", "f16c", "bmi")))
    return {"model": model, "isa": " ".join(isa), "logical_cpus": os.cpu_count()}


def _packages(names: Iterable[str]) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = "absent"
    return out


def _torch() -> dict[str, Any]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        return {"version": f"unavailable: {e}"}
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda_build": torch.version.cuda or "none",
        "cuda_available": torch.cuda.is_available(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        "gloo_available": dist.is_available() and dist.is_gloo_available(),
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "none",
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "blas": _blas(torch),
    }
    if info["nccl_available"]:
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001 - report, do not fail
            info["nccl"] = f"unavailable: {e}"
    return info


def _blas(torch: Any) -> str:
    cfg = torch.__config__.show()
    for line in cfg.splitlines():
        if "BLAS_INFO" in line:
            return line.split("=", 1)[-1].strip().rstrip(",")
    return "unknown"


def _gpus() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return {"status": "unavailable: nvidia-ml-py not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"status": f"unavailable: {e}"}
    try:
        n = pynvml.nvmlDeviceGetCount()
        gpus = []
        for i in range(n):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"name": _s(pynvml.nvmlDeviceGetName(h))}
            for key, fn in (("ecc_mode", pynvml.nvmlDeviceGetEccMode), ("mig_mode", pynvml.nvmlDeviceGetMigMode)):
                try:
                    g[key] = list(fn(h))[0]
                except pynvml.NVMLError as e:
                    g[key] = f"n/a ({e})"
            gpus.append(g)
        return {"status": "ok", "driver": _s(pynvml.nvmlSystemGetDriverVersion()), "count": n,
                "models": sorted({g["name"] for g in gpus}), "ecc_modes": sorted({str(g["ecc_mode"]) for g in gpus}),
                "mig_modes": sorted({str(g["mig_mode"]) for g in gpus})}
    finally:
        pynvml.nvmlShutdown()


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def collect_fingerprint(packages: Iterable[str] = DEFAULT_PACKAGES, env: Mapping[str, str] | None = None,
                        env_prefixes: Iterable[str] = ENV_PREFIXES) -> dict[str, Any]:
    """This process's view of its node. Cost: imports torch, one NVML init; ~no I/O."""
    env = os.environ if env is None else env
    prefixes = tuple(env_prefixes)
    fp: dict[str, Any] = {
        "python": {"version": sys.version.split()[0], "implementation": platform.python_implementation()},
        "torch": _torch(),
        "gpu": _gpus(),
        "cpu": _cpu(),
        "kernel": {"release": platform.release(), "machine": platform.machine()},
        "threads": {k: env.get(k, "unset") for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "packages": _packages(packages),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(prefixes) and k not in _ENV_IGNORE},
        "image": {"digest": env.get("TITAN_IMAGE_DIGEST", "unset")},
        "host": {"hostname": platform.node(), "pid": os.getpid()},
    }
    return fp


def flatten(fp: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"torch": {"version": "2.13"}}`` → ``{"torch.version": "2.13"}`` (values as text)."""
    out: dict[str, str] = {}
    for k, v in fp.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            if k == "env" and not prefix:
                # Every variable is its own key, so a variable set on one node only shows.
                for ek, ev in v.items():
                    out[f"env.{ek}"] = str(ev)
            else:
                out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)
    return out


def compute_group_key(fp: Mapping[str, Any]) -> str:
    """Ranks with the same key must compute bit-identical GEMMs (device, libraries, threads, ISA)."""
    t = fp.get("torch", {})
    parts = [str(fp.get("gpu", {}).get("models")), str(t.get("version")), str(t.get("cuda_build")),
             str(t.get("blas")), str(t.get("intra_op_threads")), str(fp.get("cpu", {}).get("isa")),
             str(fp.get("cpu", {}).get("model"))]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
