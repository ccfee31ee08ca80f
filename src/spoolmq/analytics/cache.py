"""What the job parsed before: a parse cache in the output directory, so that a re-run reads
only what is new (``spoolmq analytics`` without ``--full``).

Segments and event files only ever grow at their end, until they are deleted (retention),
replaced whole (compaction writes a new file and renames it over the old one) or, for an
event file after a failed write, cut back. So each input file's parsed rows can be kept, as
Parquet, with how far into the file they reach (the *extent*: always the end of a whole
line), and a re-run parses only the bytes after it. The figures are then computed from every
file's rows, as a cold run computes them from the lines, so a re-run gives exactly what a
cold run on the same store gives.

Layout under ``<out>/cache/`` (0700; driver-side bookkeeping here, Parquet written by Spark):

- ``manifest.json``: the cache's version, the data directory it describes and, per input
  file (by its path under the data directory), its id, device and inode, extent, a CRC of
  the 256 bytes before the extent and the Parquet part files that hold its rows;
- ``segments/file_id=<id>/part-*.parquet`` and ``events/file_id=<id>/part-*.parquet``: the
  parsed rows, one directory per input file (``partitionBy("file_id")``), a part file per
  run that read some of it;
- ``stage/``: during a run only, the bytes to parse this run, copied out of the store (the
  text reader cannot start inside a file, and a file being appended to must be read only up
  to the extent recorded for it); ``stage/fragments/`` holds a file's last line when it
  does not end with a newline yet (a write in progress, or a torn one): parsed in every run,
  never kept, as a cold run would see it.

A file is parsed again from its start when it is new, another file now has its name (device
or inode differ), it is shorter than its extent, the bytes before its extent changed, its
directory lost a part file, or it has more than MAX_PARTS part files (so that a file read
a little at a time by many runs does not become many tiny Parquet files). Part files a run
wrote but did not record (it stopped between writing and recording) are deleted before the
next run reads the cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from spoolmq.files import make_private_dirs

CACHE_VERSION = 1
KINDS = ("segments", "events")
MAX_PARTS = 32
_CHECK_BYTES = 256
_CHUNK = 1 << 20


def file_id(kind: str, name: str) -> str:
    """A file's directory name in the cache: never all digits (Spark would type the column
    as a number), the same on every run."""
    return "f" + hashlib.sha1(f"{kind}/{name}".encode()).hexdigest()[:20]


@dataclass
class Entry:
    """What the cache holds of one input file."""

    id: str
    dev: int
    ino: int
    extent: int
    check: int
    parts: list[str] = field(default_factory=list)

    def holds(self, status: os.stat_result) -> bool:
        """Whether its rows may still describe the file ``status`` is of, judged without
        reading it: the same file (not replaced), not cut back below what was parsed, and
        not due to be parsed again whole (MAX_PARTS). ``ParseCache`` then also checks the
        bytes before the extent."""
        return (
            (self.dev, self.ino) == (status.st_dev, status.st_ino)
            and self.extent <= status.st_size
            and len(self.parts) < MAX_PARTS
        )


def _read_manifest(
    root: Path, data_dir: Path, fingerprint: str
) -> dict[str, dict[str, Entry]] | None:
    """The entries of the manifest at ``root`` per kind and file name; None when there is
    none, or it is not one this version wrote for ``data_dir`` (resolved) with this
    ``fingerprint``."""
    try:
        data = orjson.loads((root / "manifest.json").read_bytes())
        if (data["version"], data["data_dir"], data["fingerprint"]) != (
            CACHE_VERSION,
            str(data_dir),
            fingerprint,
        ):
            return None
        return {
            kind: {name: Entry(**entry) for name, entry in data["files"][kind].items()}
            for kind in KINDS
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or not one this version wrote: start again


@dataclass(frozen=True)
class Piece:
    """A file staged to be parsed: its name, the extent its rows will reach, and the check
    of the bytes before that extent (taken when staged: they cannot change after)."""

    name: str
    end: int
    check: int


@dataclass
class Staged:
    """The files one kind's pieces were copied to: ``keep`` (parse and add to the cache)
    and ``fragments`` (parse this run only)."""

    keep: list[Path] = field(default_factory=list)
    fragments: list[Path] = field(default_factory=list)
    parsed_bytes: int = 0
    reused_bytes: int = 0
    files_parsed: int = 0
    files_reused: int = 0
    files_dropped: int = 0


def _check(fd: int, extent: int) -> int:
    """CRC-32 of the bytes just before ``extent`` (a change there means the file was
    rewritten, not only appended to)."""
    start = max(0, extent - _CHECK_BYTES)
    return zlib.crc32(os.pread(fd, extent - start, start))


def _last_line_end(fd: int, start: int, size: int) -> int:
    """The end of the last whole line between ``start`` and ``size`` (``start`` if none)."""
    position = size
    while position > start:
        begin = max(start, position - _CHUNK)
        found = os.pread(fd, position - begin, begin).rfind(b"\n")
        if found >= 0:
            return begin + found + 1
        position = begin
    return start


def _copy(fd: int, start: int, end: int, target: Path) -> None:
    make_private_dirs(target.parent)
    out = os.open(target, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        offset = start
        while offset < end:
            try:
                sent = os.copy_file_range(fd, out, end - offset, offset)
            except OSError:  # another file system, or a kernel without it
                sent = os.write(out, os.pread(fd, min(_CHUNK, end - offset), offset))
            if sent == 0:
                raise OSError(f"could not copy {end - offset} bytes for {target}")
            offset += sent
    finally:
        os.close(out)


class ParseCache:
    """The cache of one output directory (see the module's docstring)."""

    def __init__(
        self, root: Path, data_dir: Path, *, fingerprint: str = "", full: bool = False
    ) -> None:
        """``fingerprint`` names what made the parsed rows (the job's parsing code): a cache
        written with another (by another spoolmq) is started again, as is any cache with
        ``full``."""
        self.root = root
        self.data_dir = data_dir.resolve()
        self.fingerprint = fingerprint
        self.files: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        # The kinds of which this run dropped rows the cache held (a file deleted, or
        # parsed again from its start, now or by a run that stopped before its manifest
        # said so): figures kept from earlier runs may count them.
        self.dropped: set[str] = set()
        self._planned: dict[str, list[Piece]] = {kind: [] for kind in KINDS}
        manifest = self._load()
        if full or manifest is None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            self.files = manifest
        make_private_dirs(root)
        shutil.rmtree(self.stage, ignore_errors=True)
        for kind in KINDS:
            self._tidy(kind)

    @property
    def rewound(self) -> bool:
        """Whether this run dropped rows the cache held, of either kind."""
        return bool(self.dropped)

    @property
    def stage(self) -> Path:
        return self.root / "stage"

    def table(self, kind: str) -> Path:
        return self.root / kind

    def parts(self, kind: str) -> dict[str, list[str]]:
        """Each file's id and part files, of ``kind`` (what a later run can tell new
        part files from, with ``parts_not_in``)."""
        return {entry.id: sorted(entry.parts) for entry in self.files[kind].values()}

    def parts_not_in(self, kind: str, covered: dict[str, list[str]]) -> list[Path]:
        """The part files of ``kind`` that ``covered`` (an earlier ``parts``) does not list."""
        paths = []
        for entry in self.files[kind].values():
            known = set(covered.get(entry.id, ()))
            directory = self.table(kind) / f"file_id={entry.id}"
            paths += [directory / part for part in sorted(entry.parts) if part not in known]
        return paths

    def parts_in(self, kind: str, covered: dict[str, list[str]]) -> list[Path]:
        """The part files of ``kind`` that ``covered`` lists and the cache still holds."""
        paths = []
        for entry in self.files[kind].values():
            known = set(covered.get(entry.id, ()))
            directory = self.table(kind) / f"file_id={entry.id}"
            paths += [directory / part for part in sorted(entry.parts) if part in known]
        return paths

    def holds_rows(self, kind: str) -> bool:
        """Whether any file of ``kind`` has parsed rows in the cache."""
        return any(entry.parts for entry in self.files[kind].values())

    def _load(self) -> dict[str, dict[str, Entry]] | None:
        return _read_manifest(self.root, self.data_dir, self.fingerprint)

    def _tidy(self, kind: str) -> None:
        """Delete what the manifest does not list: directories of files it forgot, part
        files a stopped run wrote, Spark's leftovers; forget files whose parts are gone."""
        table = self.table(kind)
        if not table.is_dir():
            # Rows the manifest lists are gone (a run that stopped after dropping them):
            # what earlier runs kept may count them.
            if any(entry.parts for entry in self.files[kind].values()):
                self.dropped.add(kind)
            self.files[kind] = {}
            return
        ids = {entry.id: name for name, entry in self.files[kind].items()}
        for path in table.iterdir():
            if not path.name.startswith("file_id=") or path.name[8:] not in ids:
                _remove(path)
                continue
            name = ids[path.name[8:]]
            keep = set(self.files[kind][name].parts)
            for part in path.iterdir():
                if part.name not in keep and part.name.lstrip(".").removesuffix(".crc") not in keep:
                    _remove(part)
        for name, entry in list(self.files[kind].items()):
            directory = table / f"file_id={entry.id}"
            if not all((directory / part).is_file() for part in entry.parts):
                _remove(directory)
                del self.files[kind][name]
                if entry.parts:
                    self.dropped.add(kind)

    def plan(self, kind: str, paths: list[Path]) -> Staged:
        """Decide what of ``paths`` (files of ``kind`` under the data directory) to parse,
        drop the cached rows that no longer hold, and copy the bytes to parse into the
        stage. Returns the staged files and the run's figures."""
        staged = Staged()
        known = self.files[kind]
        present: set[str] = set()
        for path in paths:
            name = path.resolve().relative_to(self.data_dir).as_posix()
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # deleted by retention since it was listed
                continue
            try:
                present.add(name)
                self._plan_file(kind, name, fd, known.get(name), staged)
            finally:
                os.close(fd)
        for name in set(known) - present:
            _remove(self.table(kind) / f"file_id={known.pop(name).id}")
            staged.files_dropped += 1
            self.dropped.add(kind)
        return staged

    def _plan_file(self, kind: str, name: str, fd: int, entry: Entry | None, out: Staged) -> None:
        status = os.fstat(fd)
        size = status.st_size
        usable = (
            entry is not None and entry.holds(status) and _check(fd, entry.extent) == entry.check
        )
        if entry is not None and not usable:
            _remove(self.table(kind) / f"file_id={entry.id}")
            self.dropped.add(kind)
        if not usable:
            entry = Entry(file_id(kind, name), status.st_dev, status.st_ino, 0, 0)
            self.files[kind][name] = entry
        assert entry is not None
        start = entry.extent
        end = _last_line_end(fd, start, size)
        # Segments: the job takes topic and partition from the path (logs/TOPIC/PARTITION/).
        where = Path(kind, *name.split("/")[1:3]) if kind == "segments" else Path(kind)
        if end > start:
            target = self.stage / where / f"{entry.id}.jsonl"
            _copy(fd, start, end, target)
            out.keep.append(target)
            out.parsed_bytes += end - start
            out.files_parsed += 1
            self._planned[kind].append(Piece(name, end, _check(fd, end)))
        elif usable:  # a new file with no whole line yet is neither parsed nor reused
            out.files_reused += 1
        out.reused_bytes += start
        if size > end:
            fragment = self.stage / "fragments" / where / f"{entry.id}.jsonl"
            _copy(fd, end, size, fragment)
            out.fragments.append(fragment)

    def record(self, kind: str) -> None:
        """After Spark wrote the staged rows of ``kind``: note each file's new extent and
        part files."""
        for piece in self._planned[kind]:
            entry = self.files[kind][piece.name]
            directory = self.table(kind) / f"file_id={entry.id}"
            written = (
                [p.name for p in directory.iterdir() if not p.name.startswith(".")]
                if directory.is_dir()
                else []
            )
            entry.parts = sorted(set(entry.parts) | set(written))
            entry.extent, entry.check = piece.end, piece.check
        self._planned[kind] = []

    def commit(self) -> None:
        """Write the manifest (atomically). The stage stays until ``close``: the fragments
        are read from it whenever Spark computes a figure."""
        data = {
            "version": CACHE_VERSION,
            "data_dir": str(self.data_dir),
            "fingerprint": self.fingerprint,
            "files": {
                kind: {name: asdict(entry) for name, entry in sorted(entries.items())}
                for kind, entries in self.files.items()
            },
        }
        partial = self.root / "manifest.json.partial"
        partial.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
        os.replace(partial, self.root / "manifest.json")

    def close(self) -> None:
        """Remove the stage (once the run has computed everything)."""
        shutil.rmtree(self.stage, ignore_errors=True)


def bytes_to_parse(
    root: Path, data_dir: Path, files: dict[str, list[Path]], *, fingerprint: str
) -> int | None:
    """How many bytes of ``files`` (per kind) a run into the cache at ``root`` would parse,
    judged from its manifest alone (sizes, identities and extents; nothing is read or
    changed): None when there is no usable cache, or the run would drop rows it holds (a
    file deleted, replaced, cut back, or to be parsed again whole: what is kept from them
    is computed again). For choosing the JVM before a run."""
    manifest = _read_manifest(root, data_dir.resolve(), fingerprint)
    if manifest is None:
        return None
    total = 0
    for kind, paths in files.items():
        known = manifest[kind]
        for path in paths:
            try:
                status = path.stat()
                entry = known.pop(path.resolve().relative_to(data_dir.resolve()).as_posix(), None)
            except (OSError, ValueError):
                continue
            if entry is None:
                total += status.st_size
            elif entry.holds(status):
                total += status.st_size - entry.extent
            else:
                return None
    if any(entry.parts for known in manifest.values() for entry in known.values()):
        return None  # a file with cached rows is gone
    return total


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
