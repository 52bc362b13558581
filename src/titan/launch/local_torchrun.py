"""torchrun on one node with Titan's bound, signed rendezvous (for Titan's own helper jobs).

``python -m titan.launch.local_torchrun [torchrun options] script|-m module [args]`` is
``torchrun --standalone`` except that every store listens on loopback only and the
rendezvous state is signed under a random key (``titan.launch.secure``). ``titan preflight``
runs its local job through it; ``titan run`` does the same in-process.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid

from titan.launch.secure import plan_security

__all__ = ["main"]

log = logging.getLogger(__name__)


def main(argv: list[str]) -> None:
    """Run torchrun's ``run`` on ``argv`` (no ``--standalone``/rendezvous flags); raises what it raises."""
    from torch.distributed import run as tdr

    from titan.launch.rdzv_auth import check_private_api

    check_private_api()
    plan = plan_security(backend="c10d", endpoint=None, multi_node=False, local_addr=None, secret_file=None,
                         insecure=False, disable_shared_store=True, environ=os.environ)
    plan.apply_env(os.environ, disable_shared_store=True)
    args = tdr.parse_args(["--rdzv-backend", plan.torch_backend, "--rdzv-endpoint", plan.endpoint,
                           "--rdzv-id", uuid.uuid4().hex, "--local-addr", plan.listen.addr, *argv])
    with plan.rendezvous(lambda kind, msg, data: log.error("%s", msg)):
        tdr.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
