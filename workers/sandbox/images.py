"""The node's cache of Singularity images: each image is pulled or built once, never per job.

Images live in ``settings.image_cache`` (put it on shared storage and every
node reuses the same file). A per-image flock makes concurrent workers wait for
the one download instead of starting their own, and the file appears under its
final name only once complete (written under a temporary name, then renamed).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

_URI = re.compile(r"^(docker|oras|library|shub|https)://")

# (source, destination) -> None: fetch ``source`` (a URI or a .def file) into ``destination``.
Fetcher = Callable[[str, Path], None]


def spython_fetch(source: str, destination: Path) -> None:
    """Pull a URI or build a definition file with spython (which runs ``singularity``;
    Apptainer installs that name as a compatibility link)."""
    from spython.main import Client

    if _URI.match(source):
        Client.pull(source, name=str(destination), pull_folder=str(destination.parent), quiet=True)
    else:
        Client.build(recipe=source, image=str(destination), sudo=False, options=["--fakeroot"], quiet=True)
    if not destination.exists():
        raise RuntimeError(f"singularity did not produce {destination} from {source}")


class ImageCache:
    def __init__(self, cache_dir: Path, fetch: Fetcher = spython_fetch) -> None:
        self.cache_dir = cache_dir
        self.fetch = fetch

    def cached_name(self, source: str) -> str:
        """A stable file name: readable stem plus a hash of the URI (or the .def's content)."""
        key = source.encode() if _URI.match(source) else Path(source).read_bytes()
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", source.split("://")[-1].rsplit("/", 1)[-1])[:60]
        return f"{stem}-{hashlib.sha256(key).hexdigest()[:16]}.sif"

    def resolve(self, source: str) -> Path:
        """The local .sif for ``source``: a .sif path as is, else from the cache (fetched once)."""
        if source.endswith(".sif") and not _URI.match(source):
            path = Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"image {source} does not exist")
            return path
        if not _URI.match(source) and not source.endswith(".def"):
            raise ValueError(f"image {source!r} is neither a .sif, a .def nor a docker/oras/library/shub URI")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        final = self.cache_dir / self.cached_name(source)
        if final.exists():
            return final
        with open(self.cache_dir / f"{final.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if final.exists():  # another worker fetched it while we waited
                return final
            partial = final.with_name(f".{final.name}.{os.getpid()}.partial")
            try:
                self.fetch(source, partial)
                os.replace(partial, final)
            finally:
                partial.unlink(missing_ok=True)
        return final
