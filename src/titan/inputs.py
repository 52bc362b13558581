"""Checks of user-given input shared by several layers (ground floor: imports only
``titan.errors``): run and node ids (they name files), host names, ``HOST[:PORT]`` endpoints,
and bounded reads of the small files a user names (settings, plans, fingerprints). Each raises
``UserError`` with a hint; the CLI wraps them as argparse types (``titan.cli._common``)."""

from __future__ import annotations

import ipaddress
import os
import re
import stat

from titan.errors import UserError

__all__ = ["check_id", "check_host", "check_host_port", "read_text_file", "open_regular_fd", "NotRegularFile",
           "file_kind", "MAX_INPUT_BYTES"]

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_id(value: str, what: str) -> str:
    """Validate a run or node id (used in file names): letters, digits, ``.``, ``_``, ``-``."""
    if not isinstance(value, str) or not _SAFE_ID.fullmatch(value):
        raise UserError(
            f"invalid {what} {value!r}",
            "use letters, digits, '.', '_' or '-' (at most 128 characters), starting with a letter or digit",
        )
    return value

_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9][A-Za-z0-9_-]{0,62}(?:\.[A-Za-z0-9_-]{1,63})*\.?$")
_ENDPOINT = re.compile(r"^(\[[^\]]*\]|[^:\[\]]*)(?::([^:]*))?$")
_HOST_HINT = "use a host name (letters, digits, '-', '.') or an IP address, e.g. node0 or 10.0.0.5"
_EP_HINT = "give HOST:PORT, e.g. node0:29400 or [fd00::1]:29400 (port 1 … 65535)"


def check_host(text: str, what: str = "host") -> str:
    """A host name, an IPv4/IPv6 address or ``[IPv6]``; never ``user@``, a path or shell syntax."""
    t = text.strip()
    inner = t[1:-1] if t.startswith("[") and t.endswith("]") else t
    try:
        ipaddress.ip_address(inner)
        return t
    except ValueError:
        pass
    if _HOST.match(t) and not re.fullmatch(r"[0-9.]+", t):
        return t
    raise UserError(f"{what} {text!r} is not a host name or IP address", _HOST_HINT)


def check_host_port(text: str, what: str = "endpoint") -> str:
    """``HOST[:PORT]``: a valid host (see ``check_host``) and a port within 1 … 65535."""
    t = text.strip()
    m = _ENDPOINT.match(t)
    if not m or not m.group(1):
        raise UserError(f"{what} {text!r} is not HOST[:PORT]", _EP_HINT)
    try:
        check_host(m.group(1))
    except UserError:
        raise UserError(f"{what} {text!r} is not HOST[:PORT] (bad host {m.group(1)!r})", _EP_HINT) from None
    port = m.group(2)
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise UserError(f"{what} {text!r} is not HOST[:PORT] (bad port {port!r})", _EP_HINT)
    return t


#: Largest user-given file that is read whole (settings, plans, fingerprints, overhead JSON).
MAX_INPUT_BYTES = 64 << 20


class NotRegularFile(ValueError):
    """The path opened is a directory, device, FIFO or socket; ``kind`` says which."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"{path!r} is not a regular file ({kind})")
        self.path, self.kind = path, kind


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words ("a directory", "a FIFO", …)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular_fd(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only (blocking mode restored) and return ``(fd, fstat)``.

    The one place that opens a file someone named or a record points at: ``O_NONBLOCK`` so a
    FIFO cannot block the open, ``O_NOCTTY``/``O_CLOEXEC``, then the *opened* object is checked
    with ``fstat`` (no race between check and use); ``/dev/zero`` or a directory is refused
    before any read. The caller closes the descriptor. Raises ``OSError`` or ``NotRegularFile``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(os.fspath(path), file_kind(st.st_mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_text_file(path: str | os.PathLike[str], what: str, hint: str, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a small regular file the user named; ``UserError`` otherwise.

    Refuses a missing path, a directory, a device or FIFO (``/dev/zero`` would never end) and
    a file above ``max_bytes``. Cost: one ``stat`` and one bounded read.
    """
    try:
        fd, st = open_regular_fd(path)
    except NotRegularFile as e:
        kind = e.kind if e.kind == "a directory" else f"not a regular file ({e.kind})"
        raise UserError(f"{what} {path} is {kind}", hint) from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}", hint) from None
    try:
        if st.st_size > max_bytes:
            raise UserError(f"{what} {path} is {st.st_size:,} bytes (at most {max_bytes:,})", hint)
        data = os.read(fd, max_bytes + 1)
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}", hint) from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text (binary data?)", hint) from None
