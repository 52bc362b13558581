"""A node whose link is slowed (tc tbf in its own network namespace) is localised."""

from __future__ import annotations

import pytest

from pfhelpers import run_nodes
from titan.chaos.netns import Topology, netns_unavailable_reason

_REASON = netns_unavailable_reason()


@pytest.mark.netns
@pytest.mark.multinode
@pytest.mark.timeout(240)
@pytest.mark.skipif(_REASON is not None, reason=f"network namespaces unavailable: {_REASON}")
def test_slow_link_node_is_named_by_pairwise_tests(tmp_path):
    with Topology("tpf", 3) as topo:
        topo.limit_bandwidth(2, rate="40mbit")
        verdict = run_nodes(tmp_path, [{}, {}, {}], ["--max-bytes=16384", "--io-bytes=65536", "--pair-bytes=1048576",
                                                     "--skip=gemm,io"],
                            addrs=[topo.addr(i) for i in range(3)], netns=[topo.ns(i) for i in range(3)],
                            ifnames=Topology.ifnames(topo))
    links = [f for f in verdict["flags"] if f["test"] == "link"]
    assert [f["member"] for f in links] == ["node2/rank2"], (verdict["flags"], verdict["pairs"])
    assert verdict["exit_code"] == 7
