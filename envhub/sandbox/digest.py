"""A digest of everything a session's commands could have written: two sessions with the same
digest hold the same files.

:func:`files_digest` hashes, inside the session, every entry under the folders its backend lets
a command write to (:attr:`~envhub.sandbox.Session.writable_roots`: ``/sandbox``, ``/tmp`` and
``/dev`` for a local session), without following links: each entry's path, type and mode, a link's
target, and a regular file's size, modification time and contents. Folders' times are left
out (a session's own ``/tmp`` is made when it starts); files' times stay in, since Python's
bytecode cache trusts a source file whose time and size match its ``.pyc``. A backend that cannot
say where commands write (e2b: the whole VM) has no digest.

End the session's processes first (:meth:`~envhub.sandbox.Session.akill_processes`): one left
running could change a file after it is read. The hasher runs isolated (``python3 -I -S``: no
variable, site or current folder of the session's reaches it); any entry it cannot read
(a file made unreadable, a tree too deep) leaves the session without a digest, never with a
digest that two different trees could share.
"""

from __future__ import annotations

import re

from envhub.sandbox.session import Session

_HASHER = """
import hashlib, os, stat, sys

def visit(digest, folder, shown):
    with os.scandir(folder) as listing:
        entries = sorted(listing, key=lambda e: os.fsencode(e.name))
    for entry in entries:
        info = entry.stat(follow_symlinks=False)
        path = os.path.join(shown, os.fsencode(entry.name))
        record = [path, info.st_mode]
        if stat.S_ISREG(info.st_mode):
            record += [info.st_size, info.st_mtime_ns, contents(entry.path)]
        elif stat.S_ISLNK(info.st_mode):
            record.append(os.fsencode(os.readlink(entry.path)))
        digest.update(repr(record).encode() + b"\\n")
        if stat.S_ISDIR(info.st_mode):
            visit(digest, entry.path, path)

def contents(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

digest = hashlib.sha256()
for root in sys.argv[1:]:
    digest.update(repr([os.fsencode(root), os.lstat(root).st_mode]).encode() + b"\\n")
    visit(digest, root, os.fsencode(root))
print(digest.hexdigest())
"""
"""Run as ``python3 -I -c _HASHER ROOT...``; prints the digest, or fails."""
_HEX = re.compile(r"[0-9a-f]{64}")
DIGEST_WALL_TIME = 30.0
"""Seconds the hasher may take (a session's disk is bounded: ``disk_mb``)."""


async def files_digest(session: Session) -> str | None:
    """The digest (64 hex digits) of every file ``session``'s commands could have written, or
    ``None``: the backend cannot say where they write, or the hasher could not read them all
    (see the module docstring)."""
    roots = session.writable_roots
    if not roots:
        return None
    argv = ["python3", "-I", "-S", "-c", _HASHER, *roots]
    result = await session.arun(argv, wall_time=DIGEST_WALL_TIME)
    digest = result.stdout.strip()
    return digest if result.ok and _HEX.fullmatch(digest) else None
