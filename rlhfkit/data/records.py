"""Read dataset records from a file, a folder, the Hugging Face hub or memory, each with where it came from.

Sources (a path is chosen by its suffix; an existing local path always wins over a hub name):
  *.jsonl          one JSON object per line (blank lines are skipped)
  *.json           a list of objects, or {"data": [...]}, or JSON Lines (one object per line)
  *.parquet        read with pyarrow
  *.csv, *.arrow   a header line and one row a line (column types inferred); an Arrow stream or file
  a folder         a HF `datasets` folder written by `save_to_disk` (a `DatasetDict` -> `split`), or a
                   folder of data files as `datasets.load_dataset(folder)` reads it (a downloaded hub
                   dataset: its README's configs, `config`, `data_dir`, `split`)
  org/name         a hub dataset, `datasets.load_dataset(name, config, split=split, data_dir=data_dir)`;
                   `org/name@dir` is OpenRLHF's spelling of data_dir=dir. Offline (HF_HUB_OFFLINE=1)
                   it is read from the datasets cache or from a snapshot in the hub cache
                   (`hf download --repo-type dataset org/name`).
  reasoning_gym:TASK  entries of a reasoning-gym task, generated (`rlhfkit.data.procedural`)
  a list of dicts  records already in memory (a notebook's data)
  a `datasets.Dataset` / `DatasetDict` object (a `DatasetDict` -> `split`, as for folders)

Several datasets read as one (OpenRLHF's `blending_datasets`): a `Blend` of sources (`as_source`
makes one from OpenRLHF's comma-separated spelling `a.jsonl,b.jsonl` and its `--dataset_probs`
`0.7,0.3`), concatenated without probabilities, interleaved with them (`blend_order`).

`split` picks one split of a source that has several (a DatasetDict, a hub dataset); single files
have none and ignore it. Shared by every dataset kind (prompts, SFT, preference pairs). Errors are
`DataError`s that name the source (`source_name`: the path or hub name, or "in-memory list" /
"in-memory Dataset") and the line or record ("record 3", numbered from 0 as in .json files).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from rlhfkit.data.procedural import is_procedural, reasoning_gym_records
from rlhfkit.errors import ConfigError, DataError, first_line, one_line

if TYPE_CHECKING:
    import datasets

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow")

# What every loader reads: a path, records in memory, a HF `datasets` object, or a Blend of them.
Source = Union[str, Path, list[dict], "datasets.Dataset", "datasets.DatasetDict", "Blend"]


@dataclass(frozen=True)
class Blend:
    """Several sources read as one dataset, as OpenRLHF's `blending_datasets` reads them.

    Each source keeps its first `max_count` records (all when None). Without `probs` the records are
    concatenated in order; with `probs` (one per source, summing to 1) they are interleaved as
    `datasets.interleave_datasets(parts, probabilities=probs, seed=seed,
    stopping_strategy="all_exhausted")` interleaves them: each next record is drawn from a source
    chosen with these probabilities, a source that runs out starts again, until every source has
    been read to its end at least once (so the rare ones are not cut short and the common ones repeat).
    """

    sources: tuple
    probs: tuple[float, ...] | None = None
    seed: int = 42
    max_count: int | None = None


def as_source(source: Source, probs: str | None = None, seed: int = 42, max_count: int | None = None,
              flag: str = "--data.dataset_probs") -> Source:
    """`source` itself, or a `Blend` when it is OpenRLHF's comma-separated list of datasets (a string
    with commas that is not an existing path) or `probs` (comma-separated, one per dataset) is given;
    `flag` names `probs` in errors."""
    parts = [source]
    if isinstance(source, str) and "," in source and not Path(source).expanduser().exists():
        parts = [p.strip() for p in source.split(",") if p.strip()]
    if probs is None and len(parts) == 1:
        return source
    weights = None if probs is None else parse_probs(probs, len(parts), flag)
    return Blend(tuple(parts), weights, seed, max_count)


def parse_probs(probs: str, n: int, flag: str = "--data.dataset_probs") -> tuple[float, ...]:
    """OpenRLHF's comma-separated sampling probabilities: `n` numbers > 0 that sum to 1 (a dataset of
    probability 0 would never be read to its end, which `Blend`'s interleaving waits for)."""
    try:
        weights = tuple(float(p) for p in str(probs).split(","))
    except ValueError:
        raise ConfigError(f"{flag} {probs!r}: expected comma-separated numbers, one per dataset") from None
    if len(weights) != n:
        raise ConfigError(f"{flag} {probs!r} has {len(weights)} probabilities for {n} dataset(s); give one "
                          "per comma-separated dataset")
    if min(weights) <= 0 or abs(sum(weights) - 1) > 1e-6:
        raise ConfigError(f"{flag} {probs!r}: the probabilities must be > 0 and sum to 1 (drop a dataset "
                          "instead of giving it 0)")
    return weights


def blend_order(sizes: list[int], probs: tuple[float, ...] | None, seed: int) -> list[tuple[int, int]]:
    """(source, row) of each record of a Blend of sources with `sizes` records (see `Blend`)."""
    if probs is None:
        return [(k, i) for k, n in enumerate(sizes) for i in range(n)]
    import datasets

    parts = [datasets.Dataset.from_dict({"source": [k] * n, "row": list(range(n))}) for k, n in enumerate(sizes)]
    mixed = datasets.interleave_datasets(parts, probabilities=list(probs), seed=seed,
                                         stopping_strategy="all_exhausted")
    return list(zip(mixed["source"], mixed["row"]))


def _read_blend(blend: Blend, split: str, config: str | None, data_dir: str | None) -> list[Record]:
    parts = []
    for part in blend.sources:
        records = read_records(part, split, config, data_dir)[: blend.max_count]
        parts.append([Record(r.data, f"{source_name(part)}, {r.where}") for r in records])
    return [parts[k][i] for k, i in blend_order([len(p) for p in parts], blend.probs, blend.seed)]


@dataclass
class Record:
    """A record with where it came from, for error messages ("line 3" or "record 3")."""

    data: dict[str, Any]
    where: str


def read_records(source: Source, split: str = "train", config: str | None = None,
                 data_dir: str | None = None) -> list[Record]:
    """All records of `source` (a path or hub name, a list of dicts, or a `datasets.Dataset` /
    `DatasetDict`, of which `split` is taken); DataError when it is missing, malformed or empty.
    `config` and `data_dir` are `datasets.load_dataset`'s `name` and `data_dir` (hub datasets and
    folders of data files)."""
    if isinstance(source, Blend):
        records = _read_blend(source, split, config, data_dir)
    elif isinstance(source, (str, Path)):
        try:
            records = list(_read_path(source, split, config, data_dir))
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
    if isinstance(source, Blend):
        return ",".join(source_name(s) for s in source.sources)
    return f"in-memory {type(source).__name__}"


def require_key(record: Record, key: str, arg: str, source: str | Path) -> None:
    """DataError naming the source (`source_name`), record and flag when `record` lacks `key`."""
    if key not in record.data:
        raise DataError(
            f"{source}, {record.where}: no key {key!r} ({arg}); the record has keys "
            f"{sorted(record.data.keys())}; set {arg} to one of them"
        )


def label_value(record: Record, key: str, arg: str, source: str | Path) -> Any:
    """The record's `key` value; a key with dots that is no column of its own reads nested dicts, as verl's
    data holds the answer: "reward_model.ground_truth" is record["reward_model"]["ground_truth"]. DataError
    naming the source, record and flag `arg` when a part is missing."""
    if key in record.data or "." not in key:
        require_key(record, key, arg, source)
        return record.data[key]
    value: Any = record.data
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(value, dict) or part not in value:
            inside = ".".join(parts[:depth]) or "the record"
            has = f"keys {sorted(map(str, value))}" if isinstance(value, dict) else f"a {type(value).__name__}"
            raise DataError(f"{source}, {record.where}: no key {key!r} ({arg}): {inside} has {has}; set {arg} "
                            "to a column, or to a dotted path into nested columns (reward_model.ground_truth)")
        value = value[part]
    return value


def is_messages(value: Any) -> bool:
    """True for a non-empty list of dicts that each have "role" and "content"."""
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def is_hub_dataset_name(name: str) -> bool:
    """True when `name` is spelled like a hub dataset id (`org/name` or `name`, optionally with
    OpenRLHF's `@data_dir`) and not like a path (a leading / . ~, more than one /, a file suffix)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo = name.split("@", 1)[0]
    if repo.startswith(("/", ".", "~")) or repo.count("/") > 1 or Path(repo).suffix in SUPPORTED_SUFFIXES:
        return False
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def _read_path(source: str | Path, split: str, config: str | None, data_dir: str | None) -> Iterator[Record]:
    """A local path first (file or folder); otherwise a hub dataset name."""
    path = Path(source).expanduser()
    if not path.exists() and is_procedural(str(source)):  # reasoning_gym:TASK (data/procedural.py)
        yield from _read_list(reasoning_gym_records(str(source)))
        return
    if path.exists() or not is_hub_dataset_name(str(source)):
        yield from _read_records(path, split, config, data_dir)
        return
    name, _, at_dir = str(source).partition("@")
    yield from _read_dataset(_load_hub(name, split, config, data_dir or at_dir or None), split, str(source))


def _read_records(path: Path, split: str, config: str | None, data_dir: str | None) -> Iterator[Record]:
    """Yield the records of a file or HF folder, each with its location for error messages."""
    if not path.exists():
        raise DataError(f"{path}: no such file or folder; check the dataset path")
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            yield from _read_hf_folder(path, split)
        else:
            yield from _read_dataset(_load_folder(path, split, config, data_dir), split, str(path))
    elif path.suffix == ".jsonl":
        yield from _read_jsonl(path)
    elif path.suffix == ".json":
        yield from _read_json(path)
    elif path.suffix in (".parquet", ".csv", ".arrow"):
        yield from _read_table(path)
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
                line = raw_line.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a BOM (Windows editors) skipped
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
            if "\\ud" in line.lower():
                _check_surrogates(data, f"{path}, line {lineno}")
            yield Record(data, f"line {lineno}")


def _read_json(path: Path) -> Iterator[Record]:
    """A JSON list of objects, or an object whose "data" field is such a list; a file of several objects
    (JSON Lines) is read as .jsonl."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a BOM (Windows editors) skipped
    except UnicodeDecodeError as exc:
        lineno = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}, line {lineno}: bytes that are not UTF-8; re-encode the file as UTF-8"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and text.lstrip().startswith("{"):  # JSON Lines named .json, as
            yield from _read_jsonl(path)                                  # datasets' json loader reads it
            return
        raise DataError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg})") from exc
    if isinstance(data, dict) and "data" in data:
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(
            f"{path}: expected a JSON list of objects or {{\"data\": [...]}}, "
            f"got {type(data).__name__}"
        )
    surrogates = "\\ud" in text.lower()
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise DataError(
                f"{path}, record {i}: expected a JSON object, got {type(item).__name__}"
            )
        if surrogates:
            _check_surrogates(item, f"{path}, record {i}")
        yield Record(item, f"record {i}")


def _check_surrogates(data: dict, where: str) -> None:
    """DataError when a string of `data` holds half of a UTF-16 surrogate pair (an escape such as "\\ud83d"
    without its partner, as a text cut in the middle of an emoji leaves), which no tokenizer encodes."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"{where}: a lone UTF-16 surrogate escape (\\u{ord(exc.object[exc.start]):04x}), half of a "
                        "character that no tokenizer can encode; fix or drop the record") from exc


def _read_table(path: Path) -> Iterator[Record]:
    """Rows of a parquet, CSV (a header line, then one row a line; column types inferred) or Arrow file (as
    `datasets` writes them), as dicts; OpenRLHF reads these suffixes with datasets.load_dataset."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet as pq

    kind = path.suffix[1:]
    try:
        if kind == "parquet":
            table = pq.read_table(path)
        elif kind == "csv":
            table = pyarrow.csv.read_csv(path)
        else:
            try:  # datasets' .arrow files are Arrow streams; others are Arrow (IPC) files
                table = pa.ipc.open_stream(path).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(path).read_all()
        rows = table.to_pylist()
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: cannot read as {kind} ({type(exc).__name__}: {first_line(exc)})") from exc
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


def _load_folder(path: Path, split: str, config: str | None, data_dir: str | None) -> Any:
    """`datasets.load_dataset(folder)`: a folder of data files (its README's configs, if any)."""
    import datasets

    try:
        return datasets.load_dataset(str(path), config, split=split, data_dir=data_dir)
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError, EmptyDatasetError, ...
        raise DataError(
            f"{path}: neither a HF datasets folder written by save_to_disk nor a folder of data files "
            f"that datasets.load_dataset reads ({type(exc).__name__}: {_datasets_message(exc)})"
        ) from exc


def _load_hub(name: str, split: str, config: str | None, data_dir: str | None) -> Any:
    """`datasets.load_dataset(name, ...)`; when the hub cannot be asked (HF_HUB_OFFLINE, no
    network) and the datasets cache has no copy, the snapshot in the hub cache is read instead."""
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split, data_dir=data_dir)
    except ConnectionError as exc:  # offline or unreachable, and not in the datasets cache
        folder = _hub_snapshot(name, exc)
    except Exception as exc:  # DatasetNotFoundError, ValueError (split, config), ...
        raise _hub_error(name, exc) from exc
    try:
        return datasets.load_dataset(str(folder), config, split=split, data_dir=data_dir)
    except Exception as exc:
        raise _hub_error(name, exc) from exc


def _hub_snapshot(name: str, cause: BaseException) -> Path:
    """The folder of `name`'s snapshot in the hub cache; DataError saying how to fetch it when absent."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, repo_type="dataset", local_files_only=True))
    except LocalEntryNotFoundError as exc:
        why = ("HF_HUB_OFFLINE is set, so the hub is not asked" if constants.HF_HUB_OFFLINE
               else f"the hub could not be reached: {_datasets_message(cause)}")
        raise DataError(
            f"dataset {name!r}: no local file or folder of that name, and it is not in the Hugging Face "
            f"cache ({why}); fetch it with `hf download --repo-type dataset {name}` where there is a "
            "network, or unset HF_HUB_OFFLINE to download it on first use"
        ) from exc


def _hub_error(name: str, exc: BaseException) -> DataError:
    """A hub dataset's loading error as one DataError line."""
    kind = type(exc).__name__
    if kind == "DatasetNotFoundError":
        return DataError(
            f"dataset {name!r}: no local file or folder of that name, and the Hugging Face hub has no "
            f"dataset of that name ({_datasets_message(exc)}); check the name (a private or gated one "
            "needs `hf auth login`)"
        )
    return DataError(f"dataset {name!r}: {kind}: {_datasets_message(exc)}")


def _datasets_message(exc: BaseException) -> str:
    """The lines of a `datasets` error up to its usage example, joined into one line."""
    lines = []
    for line in str(exc).strip().splitlines():
        if line.strip().startswith("Example"):
            break
        lines.append(line.strip())
    return " ".join(x for x in lines if x) or type(exc).__name__


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
