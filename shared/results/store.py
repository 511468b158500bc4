"""The results store: each stage's large output in a file of its own, Redis keeping only a reference.

A file is one msgpack document compressed with zstd, written atomically (a temporary file in
the same directory, then a rename), so a reader never sees half a result and a crash leaves at
worst a stray temporary file. Files live in hourly buckets, `<root>/<YYYYmmddTHH>/<job>.<part>.msgpack.zst`
(`<job>.<part>.a<N>.msgpack.zst` for stage attempt N: two attempts of a stage never write the same file,
so a superseded attempt that finishes late cannot replace the output the record refers to),
so retention removes whole expired buckets without reading the rest. The root is a plain path: a
directory every worker and the API see (shared storage on a cluster) works the same as a local one.
"""

from __future__ import annotations

import calendar
import errno
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from shared.codec import pack, unpack
from shared.errors import ResultsUnavailable, StoredResultCorrupt, StoredResultGone

SUFFIX = ".msgpack.zst"
_BUCKET_FORMAT = "%Y%m%dT%H"
_BUCKET_SECONDS = 3600
_ATTEMPT = re.compile(r"a[0-9]{1,9}")


@dataclass(frozen=True)
class StoreHealth:
    healthy: bool
    reason: str = ""  # why not, naming the path


@dataclass(frozen=True)
class SweepReport:
    """What one retention sweep removed."""

    files: int = 0
    bytes: int = 0
    buckets: tuple[str, ...] = ()


class ResultStore:
    """Write, read and expire stored results under one root directory."""

    def __init__(self, root: Path, min_free_bytes: int = 0, level: int = 3) -> None:
        self.root = Path(root)
        self.min_free_bytes = min_free_bytes
        self.level = level

    # --- write ------------------------------------------------------------
    def put(
        self, job_id: str, part: str, value: Any, now: float | None = None, attempt: int | None = None
    ) -> tuple[str, int]:
        """Store `value` as the job's `part`; returns its reference (the bucket, and `.a<attempt>` when
        given: the file's path follows from it, the job and the part, so the record keeps only these
        few bytes) and its size.

        Raises ResultsUnavailable, naming the path, when the root is missing, unwritable or full:
        the bucket is created under an existing root, never the root itself (a missing shared
        mount must not be replaced by a local directory in silence).
        """
        bucket = time.strftime(_BUCKET_FORMAT, time.gmtime(time.time() if now is None else now))
        ref = bucket if attempt is None else f"{bucket}.a{int(attempt)}"
        data = zstandard.ZstdCompressor(level=self.level).compress(pack(value))
        if not self.root.is_dir():
            raise ResultsUnavailable(f"results directory {self.root} does not exist")
        directory = self.root / bucket
        target = self.path(job_id, part, ref)
        temp: str | None = None
        try:
            directory.mkdir(exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{job_id}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
            temp = None
        except OSError as exc:
            raise ResultsUnavailable(f"cannot write result {target}: {_describe(exc)}") from exc
        finally:
            if temp is not None:
                Path(temp).unlink(missing_ok=True)
        return ref, len(data)

    # --- read -------------------------------------------------------------
    def get(self, job_id: str, part: str, ref: str) -> Any:
        """The stored value; StoredResultGone or StoredResultCorrupt naming the job and file otherwise."""
        path = self.path(job_id, part, ref)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise StoredResultGone(job_id, str(path), "is gone (expired or removed)") from None
        except OSError as exc:
            raise StoredResultGone(job_id, str(path), f"cannot be read: {_describe(exc)}") from exc
        try:
            return unpack(zstandard.ZstdDecompressor().decompress(data))
        except Exception as exc:  # zstd and msgpack raise several types for a damaged file
            raise StoredResultCorrupt(job_id, str(path), f"is corrupt: {type(exc).__name__}: {exc}") from exc

    def path(self, job_id: str, part: str, ref: str) -> Path:
        """Where the job's part lives, given the reference its record keeps (bucket[.a<attempt>])."""
        bucket, _, attempt = ref.partition(".")
        if _bucket_start(bucket) is None or not (attempt == "" or _ATTEMPT.fullmatch(attempt)):
            raise StoredResultCorrupt(job_id, ref, "is not a results bucket (the record's reference is damaged)")
        return self.root / bucket / f"{job_id}.{part}{'.' + attempt if attempt else ''}{SUFFIX}"

    # --- upkeep -----------------------------------------------------------
    def health(self) -> StoreHealth:
        """Can a result be written now: the root exists, is writable, and has room."""
        if not self.root.is_dir():
            return StoreHealth(False, f"results directory {self.root} does not exist")
        if not os.access(self.root, os.W_OK | os.X_OK):
            return StoreHealth(False, f"results directory {self.root} is not writable")
        free = shutil.disk_usage(self.root).free
        if free < self.min_free_bytes:
            return StoreHealth(
                False, f"results directory {self.root} has {free} bytes free, below {self.min_free_bytes}"
            )
        return StoreHealth(True)

    def sweep(self, max_age_s: float, now: float | None = None) -> SweepReport:
        """Remove every bucket whose newest possible file is older than `max_age_s`."""
        cutoff = (time.time() if now is None else now) - max_age_s
        files = size = 0
        removed: list[str] = []
        if not self.root.is_dir():
            return SweepReport()
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            start = _bucket_start(entry.name)
            if start is None or not entry.is_dir() or start + _BUCKET_SECONDS > cutoff:
                continue
            for item in os.scandir(entry.path):
                try:
                    size += item.stat().st_size
                    files += not item.name.startswith(".")
                except FileNotFoundError:
                    continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
        return SweepReport(files=files, bytes=size, buckets=tuple(removed))

    def ensure_root(self) -> None:
        """Create the root: only for the embedded default under the state directory."""
        self.root.mkdir(parents=True, exist_ok=True)


def _bucket_start(name: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(name, _BUCKET_FORMAT)))
    except ValueError:
        return None


def _describe(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{exc.strerror} (the results store is full)"
    return exc.strerror or str(exc)
