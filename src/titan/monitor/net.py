"""Network collector: interface drops/errors, TCP retransmits, UDP errors, echo-probe RTT/loss.

Counters come from ``/proc/net/dev`` and ``/proc/net/snmp`` (per network namespace).
Loss-like ratios are computed over a sliding window (``window_s``) and only once the
window holds ``min_packets`` packets, so an idle link's single retransmit does not read
as 50 % loss. The active probe (``titan.monitor.probe``) adds round-trip time and loss
to the other agents of the job.
"""

from __future__ import annotations

import collections

from titan.monitor.base import ProcFS, RateTracker, Reading, metric_key, unavailable
from titan.monitor.probe import EchoProbe

__all__ = ["NetCollector", "WindowRatio"]


class WindowRatio:
    """Δnumerator / Δdenominator of two cumulative counters over the last ``window_s``."""

    def __init__(self, window_s: float, min_den: float) -> None:
        self.window_s = window_s
        self.min_den = min_den
        self._pts: collections.deque[tuple[float, float, float]] = collections.deque()

    def update(self, now: float, num: float, den: float) -> float | None:
        if self._pts and (num < self._pts[-1][1] or den < self._pts[-1][2]):
            self._pts.clear()  # counter reset
        self._pts.append((now, num, den))
        while len(self._pts) > 2 and self._pts[1][0] <= now - self.window_s:
            self._pts.popleft()
        t0, n0, d0 = self._pts[0]
        dd = den - d0
        if dd < self.min_den or dd <= 0:
            return None
        return (num - n0) / dd


class NetCollector:
    """Interface and protocol counters per tick; probe results when a probe is attached."""

    name = "net"

    def __init__(self, proc: ProcFS | None = None, *, probe: EchoProbe | None = None,
                 window_s: float = 60.0, min_packets: int = 1000) -> None:
        self.proc = proc or ProcFS("/")
        self.probe = probe
        self.window_s = window_s
        self.min_packets = min_packets
        self._ratios: dict[str, WindowRatio] = {}
        self._rates = RateTracker()

    def _ratio(self, key: str) -> WindowRatio:
        if key not in self._ratios:
            self._ratios[key] = WindowRatio(self.window_s, self.min_packets)
        return self._ratios[key]

    def collect(self, now: float) -> Reading:
        r = Reading(self.name)
        dev = self.proc.read("/proc/net/dev")
        snmp = self.proc.read("/proc/net/snmp")
        if dev is None and snmp is None:
            r.status = unavailable("/proc/net/dev and /proc/net/snmp are not readable")
            return r
        if dev is not None:
            self._dev(dev, now, r)
        if snmp is not None:
            self._snmp(snmp, now, r)
        if self.probe is not None:
            try:
                # Report what came back during the last interval, then send this tick's pings:
                # each tick reports the previous tick's probes (a fixed one-interval lag
                # instead of a race between the pong and this line).
                r.metrics.update(self.probe.metrics(now))
                self.probe.tick(now)
                r.info["probe"] = self.probe.describe()
            except OSError as e:
                r.info["probe"] = unavailable(f"echo probe failed: {e}")
        return r

    def _dev(self, text: str, now: float, r: Reading) -> None:
        ifaces = []
        for line in text.splitlines()[2:]:
            name, _, rest = line.partition(":")
            name = name.strip()
            f = rest.split()
            if len(f) < 16 or name == "lo":
                continue
            v = [int(x) for x in f[:16]]
            rx_bytes, rx_pk, rx_err, rx_drop = v[0], v[1], v[2], v[3]
            tx_bytes, tx_pk, tx_err, tx_drop = v[8], v[9], v[10], v[11]
            ifaces.append(name)
            lab = {"interface": name}
            r.metrics[metric_key("net_receive_bytes_total", **lab)] = float(rx_bytes)
            r.metrics[metric_key("net_transmit_bytes_total", **lab)] = float(tx_bytes)
            r.metrics[metric_key("net_drops_total", **lab)] = float(rx_drop + tx_drop)
            r.metrics[metric_key("net_errors_total", **lab)] = float(rx_err + tx_err)
            for key, val in (("rx", rx_bytes), ("tx", tx_bytes)):
                rate = self._rates.rate(f"{name}:{key}", val, now)
                if rate is not None:
                    mname = "net_receive_bytes_per_second" if key == "rx" else "net_transmit_bytes_per_second"
                    r.metrics[metric_key(mname, **lab)] = rate
            ratio = self._ratio(f"dev:{name}").update(now, rx_err + tx_err + rx_drop + tx_drop, rx_pk + tx_pk)
            if ratio is not None:
                r.metrics[metric_key("net_packet_loss_ratio", interface=name)] = ratio
        r.info["interfaces"] = ifaces

    def _snmp(self, text: str, now: float, r: Reading) -> None:
        tables: dict[str, dict[str, int]] = {}
        lines = text.splitlines()
        for head, vals in zip(lines[::2], lines[1::2]):
            proto, _, names = head.partition(":")
            _, _, values = vals.partition(":")
            try:
                tables[proto] = dict(zip(names.split(), (int(x) for x in values.split())))
            except ValueError:
                continue
        tcp = tables.get("Tcp", {})
        if "RetransSegs" in tcp:
            r.metrics["net_tcp_retransmitted_segments_total"] = float(tcp["RetransSegs"])
            r.metrics["net_tcp_sent_segments_total"] = float(tcp.get("OutSegs", 0))
            ratio = self._ratio("tcp").update(now, tcp["RetransSegs"], tcp.get("OutSegs", 0))
            if ratio is not None:
                r.metrics["net_tcp_retransmit_ratio"] = ratio
            r.metrics["net_tcp_errors_total"] = float(tcp.get("InErrs", 0) + tcp.get("InCsumErrors", 0))
        udp = tables.get("Udp", {})
        if udp:
            r.metrics["net_udp_receive_errors_total"] = float(udp.get("InErrors", 0))
            r.metrics["net_udp_buffer_errors_total"] = float(udp.get("RcvbufErrors", 0) + udp.get("SndbufErrors", 0))

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()
