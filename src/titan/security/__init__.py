"""Spine-level security helpers: one signer, the job secret, confined paths.

Low in the import graph (standard library, ``titan.errors`` and ``titan.settings.env`` only),
so every capability that keeps a record others could write — the rendezvous state, the
probe, a ledger — signs it with the same :class:`Signer`, and every reader of a manifest or
run directory resolves names with the same :func:`confined`.
"""

from titan.security.paths import PathEscape, check_regular, confined, is_plain_name, open_regular
from titan.security.secret import JobSecret, generate_secret, resolve_secret, secret_from_file
from titan.security.signing import SignatureError, Signer, key_id_of

__all__ = [
    "Signer", "SignatureError", "key_id_of",
    "JobSecret", "generate_secret", "resolve_secret", "secret_from_file",
    "PathEscape", "confined", "check_regular", "open_regular", "is_plain_name",
]
