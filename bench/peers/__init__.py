"""Side by side with the peers (issue 22): Titan, torchft, LM Resiliency, NVRx, torchrun + DCP.

``python bench/peers/run.py [--quick|--tiny] --json`` runs the same tinygpt workload and
fault schedule under every system; docs/peers.md has the table and how each was wired.
"""
