"""``python -m titan.workloads.tinygpt``: train tinygpt (see ``--help``)."""

from __future__ import annotations

from titan.workloads.tinygpt.train import main

if __name__ == "__main__":
    raise SystemExit(main())
