"""Run inside the ml-goodput-measurement environment: records in, goodput out.

Reads ``{"job": name, "records": [[method, kwargs], ...]}`` (JSON on stdin, from
``goodput_adapter.py``), replays every record through the library's own
``GoodputRecorder`` into an in-memory ``cloud_logger`` (the object with
``write_cloud_logging_entry`` / ``read_cloud_logging_entries`` / ``flush`` that both the
recorder and the calculator accept), then asks ``GoodputCalculator.get_job_goodput`` for
the job's goodput and badput breakdown. Nothing builds a Cloud Logging client, so nothing
looks for credentials or reaches the network; the calculator's cache goes to a temporary
directory. Prints one JSON object.
"""

from __future__ import annotations

import datetime
import json
import sys
import tempfile

from ml_goodput_measurement import goodput
from ml_goodput_measurement.src.goodput_utils import get_timestamp_from_log_entry


class MemoryCloudLogger:
    """Cloud Logging stand-in: entries kept in memory, read back in time order."""

    def __init__(self, job_name: str) -> None:
        self.job_name = job_name
        self.entries: list[tuple[datetime.datetime, dict]] = []

    def write_cloud_logging_entry(self, entry: dict) -> None:
        if entry is None or entry.get("job_name") != self.job_name:
            return
        ts = get_timestamp_from_log_entry(entry)
        if ts is not None:
            self.entries.append((ts, entry))

    def flush(self) -> None:
        return None

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        aware = lambda d: d.replace(tzinfo=datetime.timezone.utc) if d is not None and d.tzinfo is None else d  # noqa: E731
        start_time, end_time = aware(start_time), aware(end_time)
        rows = sorted(self.entries, key=lambda x: x[0])
        out = [e for ts, e in rows if (start_time is None or aware(ts) > start_time)
               and (end_time is None or aware(ts) <= end_time)]
        last = (rows[-1][0], str(len(rows))) if rows else (None, None)
        return out, last


def _dt(t: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc)


def main() -> int:
    req = json.load(sys.stdin)
    job = req["job"]
    mem = MemoryCloudLogger(job)
    rec = goodput.GoodputRecorder(job, "peers-bench", logging_enabled=True, cloud_logger=mem)
    for method, kw in req["records"]:
        kw = {k: (_dt(v) if k.endswith("time") and isinstance(v, (int, float)) else v) for k, v in kw.items()}
        getattr(rec, method)(**kw)
    with tempfile.TemporaryDirectory() as cache:
        calc = goodput.GoodputCalculator(job, "peers-bench", cloud_logger=mem, cache_dir=cache)
        value, badput, last_step = calc.get_job_goodput(include_badput_breakdown=True)
    print(json.dumps({"goodput_pct": value, "last_productive_step": last_step,
                      "badput_pct": {getattr(k, "name", str(k)): v for k, v in badput.items()}}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
