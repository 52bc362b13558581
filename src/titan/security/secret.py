"""The per-job secret: read from a file or the environment, or made at random.

Multi-node jobs share one secret (a Slurm job's environment, a Kubernetes Secret, a file on
a shared disk): ``titan run --rdzv-secret-file PATH``, else ``TITAN_RDZV_SECRET_FILE``,
else ``TITAN_RDZV_SECRET`` (the value itself; a value starting with ``hex:`` is
hex-decoded). Single-node runs and ``titan drill`` make a random one. The secret keys the
:class:`~titan.security.signing.Signer` that seals the rendezvous state and the probe's pings.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import stat
from typing import Mapping

from titan.errors import UserError
from titan.security.paths import PathEscape, open_regular
from titan.security.signing import Signer, key_id_of
from titan.settings.env import TITAN_RDZV_SECRET, TITAN_RDZV_SECRET_FILE

__all__ = ["JobSecret", "MIN_SECRET_BYTES", "generate_secret", "secret_from_file", "resolve_secret"]

#: Shortest secret accepted (bytes after stripping trailing whitespace).
MIN_SECRET_BYTES = 16
_MAX_FILE_BYTES = 64 << 10


@dataclasses.dataclass(frozen=True)
class JobSecret:
    """A job's secret key and where it came from (the key never appears in ``repr``)."""

    key: bytes = dataclasses.field(repr=False)
    source: str
    warnings: tuple[str, ...] = ()

    @property
    def key_id(self) -> str:
        """Public hex id of the key (logged on every node: equal ids mean equal secrets)."""
        return key_id_of(self.key).hex()

    def signer(self) -> Signer:
        return Signer(self.key)

    def env_value(self) -> str:
        """The form handed to Titan's own child processes in ``TITAN_RDZV_SECRET``."""
        return "hex:" + self.key.hex()


def generate_secret(source: str = "random (this launch only)") -> JobSecret:
    """A fresh 32-byte random secret."""
    return JobSecret(secrets.token_bytes(32), source)


def _check_len(key: bytes, where: str) -> bytes:
    if len(key) < MIN_SECRET_BYTES:
        raise UserError(f"the rendezvous secret from {where} has {len(key)} bytes; at least {MIN_SECRET_BYTES} are needed",
                        "make one with: head -c 32 /dev/urandom | base64 > secret; chmod 600 secret")
    return key


def secret_from_file(path: str | os.PathLike[str]) -> JobSecret:
    """Read a secret file (a regular file, ≤ 64 KiB); raises ``UserError`` saying what is wrong."""
    p = os.fspath(path)
    try:
        fd = open_regular(p, what="secret file")
    except FileNotFoundError:
        raise UserError(f"rendezvous secret file {p} does not exist",
                        "give the same secret file on every node (--rdzv-secret-file or TITAN_RDZV_SECRET_FILE)") from None
    except PathEscape as e:
        raise UserError(str(e), "the secret must be a regular file") from None
    except OSError as e:
        raise UserError(f"cannot read rendezvous secret file {p}: {e.strerror or e}",
                        "check the path and its permissions") from None
    try:
        st = os.fstat(fd)
        data = os.read(fd, _MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_FILE_BYTES:
        raise UserError(f"rendezvous secret file {p} is larger than 64 KiB", "a secret is a short random string")
    key = _check_len(data.rstrip(b" \t\r\n"), f"file {p}")
    warnings = ()
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings = (f"secret file {p} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it",)
    return JobSecret(key, f"file {p}", warnings)


def _from_value(value: str) -> JobSecret:
    v = value.strip()
    if v.startswith("hex:"):
        try:
            key = bytes.fromhex(v[4:])
        except ValueError:
            raise UserError(f"{TITAN_RDZV_SECRET} starts with 'hex:' but is not hex", "give the value itself, or hex:<hex digits>") from None
    else:
        key = v.encode()
    return JobSecret(_check_len(key, TITAN_RDZV_SECRET), f"environment {TITAN_RDZV_SECRET}")


def resolve_secret(file_flag: str | None, environ: Mapping[str, str]) -> JobSecret | None:
    """The job secret from the flag, then ``TITAN_RDZV_SECRET_FILE``, then ``TITAN_RDZV_SECRET``.

    Returns ``None`` when none is given. Raises ``UserError`` for a bad file or value.
    """
    if file_flag:
        return secret_from_file(file_flag)
    if environ.get(TITAN_RDZV_SECRET_FILE):
        return secret_from_file(environ[TITAN_RDZV_SECRET_FILE])
    if environ.get(TITAN_RDZV_SECRET):
        return _from_value(environ[TITAN_RDZV_SECRET])
    return None
