"""torch internals Titan rests on are where Titan expects them (fails loudly when torch moves them).

Every capability registers its private torch names with ``titan.private_api``; this test
imports those modules and checks each name, plus the one fact the signed rendezvous relies
on: torch's rendezvous unpickles store data only in ``_BackendRendezvousStateHolder.sync``,
from what the backend returns.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import titan.checkpoint.storage  # noqa: F401 - registers its names
import titan.guard.fsdp  # noqa: F401 - registers its names
import titan.launch.rdzv_auth  # noqa: F401 - registers its names
from titan.errors import UserError
from titan.private_api import REGISTRY, PrivateName, require, torch_checked


def test_every_registered_private_name_is_present():
    assert REGISTRY, "no private names registered: the gate checks nothing"
    gone = {f: [str(n) for n in names if not n.present()] for f, names in REGISTRY.items()}
    gone = {f: g for f, g in gone.items() if g}
    version, checked = torch_checked()
    assert not gone, (f"torch {version} moved names Titan relies on: {gone}. Read the new torch source and "
                      "update titan/launch/rdzv_auth.py (and CHECKED_TORCH) before using this torch.")
    assert checked, f"torch {version} is not in titan.private_api.CHECKED_TORCH: re-read the internals, then add it"


def test_the_rendezvous_unpickles_only_in_the_state_holder_sync():
    import torch.distributed.elastic.rendezvous as rz
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _BackendRendezvousStateHolder

    hits = []
    for f in Path(rz.__file__).parent.glob("*.py"):
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"\bpickle\.loads?\(|\bUnpickler\(|torch\.load\(", line):
                hits.append(f"{f.name}:{i}")
    src = inspect.getsource(_BackendRendezvousStateHolder.sync)
    assert len(hits) == 1 and hits[0].startswith("dynamic_rendezvous.py"), \
        f"torch's rendezvous unpickles in more places than Titan's signature covers: {hits}"
    assert "pickle.loads(state_bits)" in src and "self._backend.get_state()" in src \
        and "self._backend.set_state(" in src, "sync() no longer unpickles only what the backend returns"


def test_a_moved_name_is_refused_with_one_line_and_a_hint():
    fake = [PrivateName("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_NoSuchThing.method", "a test")]
    with pytest.raises(UserError) as e:
        require(fake, feature="the test feature")
    assert "_NoSuchThing.method" in e.value.message and "the test feature" in e.value.message and e.value.hint
