"""Safe data files: where to write, how to write, and how to know a file is still what was written.

* **Cache folder** (:func:`cache_root`): ``$ZOO_CACHE`` if set, else ``$XDG_CACHE_HOME/specialisation-zoo``
  or ``~/.cache/specialisation-zoo``; if that cannot be written, ``<tmp>/specialisation-zoo-<uid>``.
  Extracted and generated files go there whenever the user's folder must not be written.
* **Writability** (:func:`is_writable`) is decided by the mount, the permission bits and a real
  try, not by ``os.access`` alone: root passes ``os.access`` on a folder whose bits say read-only,
  and the user meant those bits.
* **Atomic writes** (:func:`atomic_path`): a file is written under ``<name>.part<pid>-<host>-<rand>``
  beside its final name and renamed with ``os.replace`` when complete, so a reader sees the whole
  file or none, and two processes writing the same file at once both succeed.
* **Stale parts** (:func:`remove_stale_parts`): part files whose writer is dead are removed (the pid
  is checked on this host; a part from another host is removed once a day old).
* **Content checksums** (:class:`ArrayHash`, :func:`content_checksum`): sha256 of named arrays,
  each hashed in blocks of rows (so worker processes can hash the blocks they produce); the
  verification of a file is remembered in the cache, keyed by its path, size, mtime and inode,
  so a later load does not hash it again (:func:`is_verified`, :func:`mark_verified`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np

FOREIGN_PART_AGE_S = 24 * 3600
"""A part file from another host is judged by its age: its pid cannot be checked from here."""

_PART = re.compile(r"^(?P<name>.+)\.part(?P<pid>\d+)(?:-(?P<host>[0-9a-f]{8})-[0-9a-f]+)?(?:\.npz)?$")


class DataFileError(ValueError, RuntimeError):
    """A data file is corrupt, truncated or not what it claims to be (a ValueError, as bad input
    is; a RuntimeError, as these errors were before)."""


def _host() -> str:
    # containers sharing a folder have their own pid namespaces but (by default) distinct host names
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


# -- where -----------------------------------------------------------------------------------------------
def is_writable(folder: Path) -> bool:
    """Whether files may be created in ``folder`` (an existing folder): not on a read-only mount,
    a write bit set that applies to us (for root: any write bit), and creating a file works."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return False
        mode = os.stat(folder).st_mode
    except OSError:
        return False
    if os.geteuid() == 0:
        if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            return False
    elif not os.access(folder, os.W_OK):
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".zoo-write-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def writable_or_missing(folder: Path) -> bool:
    """Whether ``folder`` is writable, or does not exist and its nearest existing parent is (so it
    may be created)."""
    folder = Path(folder).expanduser().absolute()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    return existing is not None and existing.is_dir() and is_writable(existing)


def cache_root() -> Path:
    """The zoo's cache folder (created if needed); see the module docstring for the choice."""
    env = os.environ.get("ZOO_CACHE")
    if env:
        root = Path(env).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        if not is_writable(root):
            raise PermissionError(f"ZOO_CACHE = {env!r}: the folder is not writable; allowed: a writable folder "
                                  "(or unset ZOO_CACHE to use ~/.cache/specialisation-zoo)")
        return root
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    for root in (Path(base) / "specialisation-zoo",
                 Path(tempfile.gettempdir()) / f"specialisation-zoo-{os.getuid()}"):
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            continue
        if is_writable(root):
            return root
    raise PermissionError("no writable cache folder (tried ~/.cache/specialisation-zoo and the temporary folder); "
                          "set ZOO_CACHE to a writable folder")


def cache_dir(*parts: str) -> Path:
    """``cache_root() / parts...``, created."""
    d = cache_root().joinpath(*parts)
    d.mkdir(parents=True, exist_ok=True)
    return d


# -- how ------------------------------------------------------------------------------------------------
def part_name(final: Path) -> Path:
    """A temporary name beside ``final`` that says which process on which host writes it."""
    return final.with_name(f"{final.name}.part{os.getpid()}-{_host()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yields a temporary path beside ``final`` to write; on a normal exit it replaces ``final``
    (atomically: readers see the old file, or none, or the whole new one), on an error it is removed."""
    final = Path(final)
    tmp = part_name(final)
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_parts(folder: Path, prefix: str = "") -> list[Path]:
    """Removes the part files ``<prefix>*.part<pid>...`` in ``folder`` whose writer is dead (this
    host: the pid is gone; another host: older than a day); returns what it removed."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    host = _host()
    for p in folder.glob(f"{prefix}*.part*"):
        m = _PART.match(p.name)
        if m is None or not p.is_file():
            continue
        stale = False
        if m["host"] is None or m["host"] == host:
            stale = not _alive(int(m["pid"]))
        else:
            with contextlib.suppress(OSError):
                stale = time.time() - p.stat().st_mtime > FOREIGN_PART_AGE_S
        if stale:
            with contextlib.suppress(OSError):  # gone already (another process cleaning), or not ours to remove
                p.unlink()
                removed.append(p)
    return removed


# -- what ------------------------------------------------------------------------------------------------
CHECKSUM_BLOCK = 1024
"""Rows per hashed block when the writer does not choose (any value gives a valid checksum)."""


def block_digests(rows: np.ndarray, block: int) -> list[bytes]:
    """sha256 digests of ``rows`` in blocks of ``block`` rows along the first axis."""
    return [hashlib.sha256(np.ascontiguousarray(rows[i:i + block]).data).digest()
            for i in range(0, rows.shape[0], block)]


class ArrayHash:
    """The hash of one array: its name, dtype and shape, then the sha256 of each block of ``block``
    rows in order (so swapping two blocks changes it). Feed blocks with :meth:`update` (whole
    blocks, the last may be short) or their digests with :meth:`update_digest`."""

    def __init__(self, name: str, dtype: np.dtype, shape: tuple[int, ...], block: int) -> None:
        self.name, self.block, self.rows, self.n = name, int(block), 0, int(shape[0])
        self._h = hashlib.sha256(f"{name}|{np.dtype(dtype).str}|{tuple(int(s) for s in shape)}|{block}".encode())

    def update(self, rows: np.ndarray) -> None:
        if self.rows % self.block:
            raise ValueError(f"ArrayHash({self.name}): a short block must be the last")
        for d in block_digests(rows, self.block):
            self._h.update(d)
        self.rows += rows.shape[0]

    def update_digest(self, digest: bytes, rows: int) -> None:
        self._h.update(digest)
        self.rows += rows

    def hexdigest(self) -> str:
        if self.rows != self.n:
            raise ValueError(f"ArrayHash({self.name}): hashed {self.rows} of {self.n} rows")
        return self._h.hexdigest()


def content_checksum(hashes: list[ArrayHash]) -> str:
    """The checksum of a file's arrays, ``"sha256-b<block>:<hex>"`` (the block size of the first
    array, which a verifier needs; every array is hashed with the same one)."""
    blocks = {h.block for h in hashes}
    if len(blocks) != 1:
        raise ValueError(f"content_checksum: arrays hashed with different blocks {sorted(blocks)}")
    total = hashlib.sha256()
    for h in sorted(hashes, key=lambda h: h.name):
        total.update(f"{h.name}={h.hexdigest()};".encode())
    return f"sha256-b{blocks.pop()}:{total.hexdigest()}"


def checksum_block(checksum: str) -> int:
    """The block size a stored checksum was computed with (to recompute it)."""
    m = re.fullmatch(r"sha256-b(\d+):[0-9a-f]{64}", checksum)
    if m is None:
        raise DataFileError(f"stored checksum {checksum!r} is not of the form 'sha256-b<block>:<64 hex digits>'")
    return int(m[1])


def checksum_of(arrays: dict[str, np.ndarray], block: int = CHECKSUM_BLOCK) -> str:
    """:func:`content_checksum` of in-memory arrays (0-d arrays count as one row)."""
    hashes = []
    for name, a in arrays.items():
        a = np.atleast_1d(a)
        h = ArrayHash(name, a.dtype, a.shape, block)
        h.update(a)
        hashes.append(h)
    return content_checksum(hashes)


def _marker(path: Path) -> Path | None:
    try:
        folder = cache_dir("verified")
    except OSError:
        return None  # no cache: verify every time
    return folder / (hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:20] + ".json")


def _identity(path: Path, checksum: str) -> dict:
    s = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": s.st_size, "mtime_ns": s.st_mtime_ns, "inode": s.st_ino,
            "checksum": checksum}


def is_verified(path: Path, checksum: str) -> bool:
    """Whether ``path``, as it is now (size, mtime, inode), was verified against ``checksum``."""
    m = _marker(path)
    try:
        return m is not None and json.loads(m.read_text()) == _identity(path, checksum)
    except (OSError, ValueError):
        return False


def mark_verified(path: Path, checksum: str) -> None:
    """Remembers that ``path`` as it is now matches ``checksum`` (in the cache, never beside it; on
    rank 0 only, the others verify again at worst)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) != 0:
        return
    m = _marker(path)
    if m is None:
        return
    with contextlib.suppress(OSError), atomic_path(m) as tmp:
        tmp.write_text(json.dumps(_identity(path, checksum)))
