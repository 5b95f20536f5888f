"""Read dataset records from a file, a folder or memory, each with where it came from.

Sources (a path is chosen by its suffix):
  *.jsonl          one JSON object per line (blank lines are skipped)
  *.json           a list of objects, or {"data": [...]}
  *.parquet        read with pyarrow
  a folder         a HF `datasets` folder written by `save_to_disk` (a `DatasetDict` -> `split`)
  a list of dicts  records already in memory (a notebook's data)
  a `datasets.Dataset` / `DatasetDict` object (a `DatasetDict` -> `split`, as for folders)

Shared by every dataset kind (prompts, SFT, preference pairs). Errors are `DataError`s that name
the source (`source_name`: the path, or "in-memory list" / "in-memory Dataset") and the line or
record ("record 3", numbered from 0 as in .json files).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from rlhfkit.errors import DataError, one_line

if TYPE_CHECKING:
    import datasets

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet")

# What every loader reads: a path, records in memory, or a HF `datasets` object.
Source = Union[str, Path, list[dict], "datasets.Dataset", "datasets.DatasetDict"]


@dataclass
class Record:
    """A record with where it came from, for error messages ("line 3" or "record 3")."""

    data: dict[str, Any]
    where: str


def read_records(source: Source, split: str = "train") -> list[Record]:
    """All records of `source` (a path, a list of dicts, or a `datasets.Dataset` / `DatasetDict`,
    of which `split` is taken); DataError when it is missing, malformed or empty."""
    if isinstance(source, (str, Path)):
        try:
            records = list(_read_records(Path(source), split))
        except OSError as exc:  # permissions, an I/O error, a file that vanished while being read
            raise DataError(f"{source}: cannot read it ({one_line(exc)}); check that the file is readable") from exc
    elif isinstance(source, (list, tuple)):
        records = list(_read_list(source))
    else:
        records = list(_read_dataset(source, split, source_name(source)))
    if not records:
        raise DataError(f"{source_name(source)}: the dataset is empty; give at least one record")
    return records


def source_name(source: Source) -> str:
    """How errors name a source: the path, or "in-memory list" / "in-memory Dataset"."""
    if isinstance(source, (str, Path)):
        return str(source)
    return f"in-memory {type(source).__name__}"


def require_key(record: Record, key: str, arg: str, source: str | Path) -> None:
    """DataError naming the source (`source_name`), record and flag when `record` lacks `key`."""
    if key not in record.data:
        raise DataError(
            f"{source}, {record.where}: no key {key!r} ({arg}); the record has keys "
            f"{sorted(record.data.keys())}; set {arg} to one of them"
        )


def is_messages(value: Any) -> bool:
    """True for a non-empty list of dicts that each have "role" and "content"."""
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _read_records(path: Path, split: str) -> Iterator[Record]:
    """Yield the records of a file or HF folder, each with its location for error messages."""
    if not path.exists():
        raise DataError(f"{path}: no such file or folder; check the dataset path")
    if path.is_dir():
        yield from _read_hf_folder(path, split)
    elif path.suffix == ".jsonl":
        yield from _read_jsonl(path)
    elif path.suffix == ".json":
        yield from _read_json(path)
    elif path.suffix == ".parquet":
        yield from _read_parquet(path)
    else:
        raise DataError(
            f"{path}: unsupported file type {path.suffix!r}; use one of "
            f"{', '.join(SUPPORTED_SUFFIXES)} or a HF datasets folder"
        )


def _read_jsonl(path: Path) -> Iterator[Record]:
    """One JSON object per line; blank lines are skipped. Lines are numbered from 1."""
    with path.open("rb") as f:
        for lineno, raw_line in enumerate(f, start=1):
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}, line {lineno}: bytes that are not UTF-8 (at column {exc.start + 1}); "
                    "re-encode the file as UTF-8"
                ) from exc
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{path}, line {lineno}: not valid JSON ({exc.msg} at column {exc.colno}); "
                    "each line must hold one JSON object"
                ) from exc
            if not isinstance(data, dict):
                raise DataError(
                    f"{path}, line {lineno}: expected a JSON object, got {type(data).__name__}"
                )
            yield Record(data, f"line {lineno}")


def _read_json(path: Path) -> Iterator[Record]:
    """A JSON list of objects, or an object whose "data" field is such a list."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}, line {lineno}: bytes that are not UTF-8; re-encode the file as UTF-8"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg})") from exc
    if isinstance(data, dict) and "data" in data:
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(
            f"{path}: expected a JSON list of objects or {{\"data\": [...]}}, "
            f"got {type(data).__name__}"
        )
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise DataError(
                f"{path}, record {i}: expected a JSON object, got {type(item).__name__}"
            )
        yield Record(item, f"record {i}")


def _read_parquet(path: Path) -> Iterator[Record]:
    """Rows of a parquet file, as dicts."""
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: cannot read as parquet ({type(exc).__name__}: {exc})") from exc
    for i, row in enumerate(rows):
        yield Record(row, f"record {i}")


def _read_hf_folder(path: Path, split: str) -> Iterator[Record]:
    """Rows of a `datasets` folder; from a DatasetDict, the rows of `split`."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError, ...
        raise DataError(
            f"{path}: not a HF datasets folder written by save_to_disk "
            f"({type(exc).__name__}: {first_line(exc)})"
        ) from exc
    yield from _read_dataset(ds, split, str(path))


def _read_list(items: list | tuple) -> Iterator[Record]:
    """Records given in memory: each item must be a dict."""
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise DataError(
                f"in-memory {type(items).__name__}, record {i}: expected a dict, "
                f"got {type(item).__name__}"
            )
        yield Record(item, f"record {i}")


def _read_dataset(ds: Any, split: str, name: str) -> Iterator[Record]:
    """Rows of a `datasets.Dataset`; from a `DatasetDict`, the rows of `split`."""
    import datasets

    suffix = ""
    if isinstance(ds, datasets.DatasetDict):
        suffix = f" of split {split!r}"
        if split not in ds:
            raise DataError(
                f"{name}: no split {split!r}; the dataset has splits {sorted(ds.keys())}"
            )
        ds = ds[split]
    if not isinstance(ds, datasets.Dataset):
        raise DataError(
            f"{name}: not a dataset; give a path (.jsonl / .json / .parquet or a datasets folder), "
            "a list of dicts, or a datasets.Dataset / DatasetDict"
        )
    for i, row in enumerate(ds):
        yield Record(dict(row), f"record {i}{suffix}")
