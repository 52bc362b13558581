"""The event spine: run directory layout, versioned schema, writer and reader.

Every capability writes events here and reads them back from here. The abort file
(``abort.py``) sits here too: any component may ask ``titan run`` to stop without restart.
"""

from __future__ import annotations

from titan.events.abort import ABORT_CODES, AbortRequest, abort_file, read_abort, request_abort
from titan.events.reader import ReadProblem, ReadResult, filter_events, read_file, read_run
from titan.events.rundir import (
    EVENT_FILE_RE, RunDir, atomic_write_json, atomic_write_text, default_node_id, new_run_id,
)
from titan.events.strict import StrictJSONError, finite, loads_strict
from titan.events.schema import INJECTED, LEVELS, SCHEMA_VERSION, Event, SchemaError, utc_iso
from titan.events.tail import EventTail
from titan.events.writer import EventWriter

__all__ = [
    "ABORT_CODES", "AbortRequest", "abort_file", "read_abort", "request_abort",
    "Event", "EventTail", "INJECTED", "EventWriter", "EVENT_FILE_RE", "LEVELS", "ReadProblem", "ReadResult", "RunDir",
    "SCHEMA_VERSION", "SchemaError", "StrictJSONError", "atomic_write_json", "atomic_write_text",
    "default_node_id", "filter_events", "finite", "loads_strict", "new_run_id", "read_file", "read_run", "utc_iso",
]
