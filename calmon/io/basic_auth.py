"""``basic_auth_users`` of the web config: bcrypt checks as exporter-toolkit makes them.

bcrypt is slow on purpose (cost 10 is ~50 ms of a core), so three things follow
exporter-toolkit's ``web/handler.go``:

- one check at a time (its ``bcryptMtx``): forty wrong passwords sent at once cost
  one core for forty checks in a row, never every core at once;
- the result of each (user, password, hash) is remembered (its ``cache``), so
  Prometheus, which sends the same credentials on every scrape, costs one check per
  restart. Granted and refused results are kept apart, so a flood of wrong
  passwords can push out other wrong passwords but never a scraper's own entry;
- an unknown user is checked against a fixed dummy hash (exporter-toolkit's, of
  "fakepassword", when the users' hashes cost 10; else one made at load with the
  highest cost among them) and refused afterwards, so a 401 takes as long whether
  the user exists or not.

bcrypt reads the first 72 bytes of a password, as Go's ``CompareHashAndPassword``
and ``htpasswd`` do. Keys of the remembered results are SHA-256 digests, never the
passwords themselves.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

CACHE_ENTRIES = 1024  # of each kind, granted and refused: a few hundred KiB at most
# exporter-toolkit's dummy hash (web/handler.go), a bcrypt of "fakepassword" at cost 10
DUMMY_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
BCRYPT_MAX_PASSWORD = 72  # bytes bcrypt reads


@dataclass(frozen=True)
class Attempt:
    """One request's credentials, with the hash they are checked against."""

    user: str
    password: bytes
    hashed: bytes  # the user's hash, or the dummy one for an unknown user
    known: bool
    key: bytes  # what the result is remembered under

    def __repr__(self) -> str:  # never a password in a log line or a traceback
        return f"Attempt(user={self.user!r}, known={self.known})"


def cost_of(hashed: bytes) -> int:
    """The cost of a ``$2y$10$...`` hash (its validity is checked by the loader)."""
    return int(hashed[4:6])


class BasicAuth:
    """Users and their bcrypt hashes; thread-safe."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = dict(users)
        cost = max((cost_of(h) for h in self.users.values()), default=10)
        self.dummy = DUMMY_HASH if cost == 10 else _dummy_hash(cost)
        self.checks = 0  # bcrypt runs so far
        self._bcrypt = threading.Lock()  # one bcrypt at a time (exporter-toolkit's bcryptMtx)
        self._lock = threading.Lock()  # the two caches
        self._granted: OrderedDict[bytes, None] = OrderedDict()
        self._refused: OrderedDict[bytes, None] = OrderedDict()

    def attempt(self, header: str | None) -> Attempt | None:
        """The credentials of an ``Authorization`` header value; None when there are
        none (no header, not ``Basic``, not base64 of UTF-8 ``user:password``)."""
        if not header or header[:6].lower() != "basic ":
            return None
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True
                                                   ).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep:
            return None
        hashed = self.users.get(user)
        known = hashed is not None
        hashed = hashed if hashed is not None else self.dummy
        secret = password.encode("utf-8")[:BCRYPT_MAX_PASSWORD]
        key = hashlib.sha256(b"".join(len(p).to_bytes(4, "big") + p for p in (
            user.encode("utf-8"), secret, hashed))).digest()
        return Attempt(user, secret, hashed, known, key)

    def cached(self, attempt: Attempt) -> bool | None:
        """The remembered result of these credentials, None when they must be checked."""
        with self._lock:
            if attempt.key in self._granted:
                self._granted.move_to_end(attempt.key)
                return True
            if attempt.key in self._refused:
                self._refused.move_to_end(attempt.key)
                return False
        return None

    def verify(self, attempt: Attempt) -> bool:
        """Check with bcrypt (one check at a time across threads) and remember."""
        with self._bcrypt:
            seen = self.cached(attempt)  # an attempt queued behind the same credentials
            if seen is not None:
                return seen
            import bcrypt

            self.checks += 1
            try:
                ok = bcrypt.checkpw(attempt.password, attempt.hashed) and attempt.known
            except ValueError:  # a hash the loader let through but bcrypt cannot read
                ok = False
        with self._lock:
            cache = self._granted if ok else self._refused
            cache[attempt.key] = None
            while len(cache) > CACHE_ENTRIES:
                cache.popitem(last=False)
        return ok

    def check(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header value names a user and their password."""
        attempt = self.attempt(header)
        if attempt is None:
            return False
        seen = self.cached(attempt)
        return self.verify(attempt) if seen is None else seen


def _dummy_hash(cost: int) -> bytes:
    import bcrypt

    return bcrypt.hashpw(b"fakepassword", bcrypt.gensalt(rounds=cost))
