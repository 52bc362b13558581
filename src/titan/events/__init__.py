"""The event spine: run directory layout, versioned schema, writer and reader.

Every capability writes events here and reads them back from here.
"""

from __future__ import annotations

from titan.events.reader import ReadProblem, ReadResult, filter_events, read_file, read_run
from titan.events.rundir import (
    EVENT_FILE_RE, RunDir, atomic_write_json, atomic_write_text, default_node_id, new_run_id,
)
from titan.events.schema import LEVELS, SCHEMA_VERSION, Event, SchemaError, utc_iso
from titan.events.writer import EventWriter

__all__ = [
    "Event", "EventWriter", "EVENT_FILE_RE", "LEVELS", "ReadProblem", "ReadResult", "RunDir",
    "SCHEMA_VERSION", "SchemaError", "atomic_write_json", "atomic_write_text",
    "default_node_id", "filter_events", "new_run_id", "read_file", "read_run", "utc_iso",
]
