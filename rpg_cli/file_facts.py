"""What was read from a local file, remembered across processes while the file stays the same.

The dry run reads each data file's footer and counts its problems with pyarrow, whose import alone is a
third of a 0.5 s dry run; a researcher re-plans the same grid against the same files many times. A fact is
kept under the file's resolved path with its mtime (ns) and size, as make judges a file changed: a file
written again is read again. The cache is an optimisation only: a missing, unreadable, corrupt or
unwritable cache file means reading the file, never an error.

    @remembered("parquet-schema", encode=..., decode=...)
    def read(path: str, mtime_ns: int, size: int) -> Any: ...   # None (or an exception) is not kept

The cache lives in $RPG_CACHE_DIR, else $XDG_CACHE_HOME/rpg, else ~/.cache/rpg (file-facts.json).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_ENV = "RPG_CACHE_DIR"
FILE_NAME = "file-facts.json"
MAX_ENTRIES = 2048  # the oldest are dropped beyond it: a few hundred data files at most are ever planned against

Reader = Callable[[str, int, int], Any]


def cache_path() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit) / FILE_NAME
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rpg" / FILE_NAME


def _load(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(path: Path, key: str, entry: list) -> None:
    """Adds one entry to the file as it is now on disk (another process may have added its own), atomically."""
    data = _load(path)
    data.pop(key, None)
    data[key] = entry
    for old in list(data)[: max(0, len(data) - MAX_ENTRIES)]:
        del data[old]
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE_NAME}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def remembered(
    kind: str, encode: Callable[[Any], Any] = lambda v: v, decode: Callable[[Any], Any] = lambda v: v
) -> Callable[[Reader], Reader]:
    """`read(path, mtime_ns, size)` memoised in this process and across processes; `encode` makes its value
    JSON (and `decode` takes it back). A value of None is not kept: the file is read again next time."""

    def wrap(read: Reader) -> Reader:
        @functools.lru_cache(maxsize=256)
        @functools.wraps(read)
        def cached(path: str, mtime_ns: int, size: int) -> Any:
            where, key = cache_path(), f"{kind}:{path}"
            entry = _load(where).get(key)
            if isinstance(entry, list) and len(entry) == 3 and entry[:2] == [mtime_ns, size]:
                try:
                    return decode(entry[2])
                except (TypeError, ValueError, KeyError, IndexError):
                    pass  # a cache another version wrote: read the file
            value = read(path, mtime_ns, size)
            if value is not None:
                _save(where, key, [mtime_ns, size, encode(value)])
            return value

        return cached

    return wrap
