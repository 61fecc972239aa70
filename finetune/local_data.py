"""Datasets from local files: each file's split from its name, one `datasets` builder for their type,
and, when a builder fails, the file and line it stopped at, said in one line (datasets, pyarrow and
pandas name neither)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import DatasetDict, load_dataset
from datasets.data_files import SPLIT_KEYWORDS
from datasets.exceptions import DatasetGenerationError

from finetune.errors import FinetuneError, first_line

BUILDERS = {
    ".txt": "text",
    ".tokens": "text",
    ".raw": "text",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}


def split_of(relative: Path) -> str | None:
    """The split a file declares by a whole word of its name (`wiki.valid.tokens`, `train-00001.jsonl`)
    or else of its nearest folder (`test/part-0.jsonl`), with the keywords `datasets` reads in a
    data folder (`val` and `dev` are validation, `eval` is test)."""
    for name in (relative.name, *reversed(relative.parent.parts)):
        words = set(re.split(r"[^a-z]+", name.lower()))
        for split, keywords in SPLIT_KEYWORDS.items():
            if words & set(keywords):
                return str(split)
    return None


def is_hidden(relative: Path) -> bool:
    """Skipped in a data folder as `datasets` skips them: dot files and folders (`.ipynb_checkpoints`
    holds copies of the data) and `__` folders (`__pycache__`)."""
    return any(part.startswith(".") for part in relative.parts) or any(
        part.startswith("__") for part in relative.parent.parts
    )


def data_files(path: Path) -> dict[str, list[str]]:
    """Files of a local dataset by split (train/valid/test in the file's or its folder's name); unnamed
    files are train, as `datasets` reads an unnamed folder (it would drop them beside named ones)."""
    if path.is_file() and path.suffix.lower() not in BUILDERS:
        raise FinetuneError(
            f"{path}: cannot tell its format from the suffix {path.suffix or '(none)'!r}; "
            f"name it as one of {', '.join(BUILDERS)}"
        )
    if path.is_file():
        files = [path]
    else:
        files = sorted(
            file
            for file in path.rglob("*")
            if file.suffix.lower() in BUILDERS and file.is_file() and not is_hidden(file.relative_to(path))
        )
    if not files:
        raise FinetuneError(f"no data files ({', '.join(BUILDERS)}) in {path}")
    empty = [str(file) for file in files if file.stat().st_size == 0]
    if empty:
        raise FinetuneError(f"empty data file(s): {', '.join(empty)}")
    if len(files) == 1:
        return {"train": [str(files[0])]}
    by_split: dict[str, list[str]] = {}
    for file in files:
        by_split.setdefault(split_of(file.relative_to(path)) or "train", []).append(str(file))
    return by_split


def builder_for(files: dict[str, list[str]]) -> str:
    builders = {BUILDERS[Path(f).suffix.lower()] for paths in files.values() for f in paths}
    if len(builders) != 1:
        raise FinetuneError(
            f"mixed data file types ({', '.join(sorted(builders))}): use one format per dataset"
        )
    return builders.pop()


def load_local(path: Path) -> DatasetDict:
    files = data_files(path)
    builder = builder_for(files)
    options = {"keep_linebreaks": True} if builder == "text" else {}
    if builder == "parquet":  # checked first: datasets logs its own error for a bad footer, then raises
        problem = first_unreadable(files, builder)
        if problem:
            raise FinetuneError(problem)
    try:
        loaded = load_dataset(builder, data_files=files, **options)
    except DatasetGenerationError as error:
        cause = error.__cause__ or error
        problem = first_unreadable(files, builder) or columns_differ(files)
        if problem:
            raise FinetuneError(problem) from None
        raise FinetuneError(f"{path}: cannot read as {builder} data ({first_line(cause)})") from None
    except ValueError as error:  # datasets' words for a split whose files hold no rows
        empty = re.search(r'"(\w+)" corresponds to no data', str(error))
        if empty and empty.group(1) in files:
            named = ", ".join(files[empty.group(1)])
            raise FinetuneError(f"{named}: no rows in it (a header or an empty list only)") from None
        raise FinetuneError(f"{path}: cannot read as {builder} data ({first_line(error)})") from None
    if builder == "json" and any(loaded[split].num_rows == len(paths) for split, paths in files.items()):
        check_rows_are_not_under_one_key(files)  # one row a file: perhaps each file is one object
    return loaded


def check_rows_are_not_under_one_key(files: dict[str, list[str]]) -> None:
    for paths in files.values():
        for path in paths:
            key = rows_under_one_key(Path(path).read_text(encoding="utf-8"))
            if key is not None:
                raise FinetuneError(
                    f"{path}: one JSON object holding its rows under {key!r}: give the rows as JSON Lines "
                    "(one object per line) or as a JSON list"
                )


def first_row_columns(path: Path) -> tuple[str, ...] | None:
    """The columns of a JSON Lines or CSV file's first row (None for other files, or if unreadable)."""
    try:
        with path.open(encoding="utf-8") as stream:
            first = next((line for line in stream if line.strip()), "")
    except (OSError, UnicodeDecodeError):
        return None
    if path.suffix.lower() == ".csv":
        return tuple(sorted(name.strip() for name in first.split(",")))
    try:
        row = json.loads(first)
    except ValueError:
        return None
    return tuple(sorted(row)) if isinstance(row, dict) else None


def columns_differ(files: dict[str, list[str]]) -> str | None:
    """Files of one dataset whose rows have other columns, named: datasets says only that it could not
    cast one table into the other's."""
    seen: dict[tuple[str, ...], str] = {}
    for paths in files.values():
        for path in paths:
            columns = first_row_columns(Path(path))
            if columns is not None:
                seen.setdefault(columns, path)
    if len(seen) < 2:
        return None
    (first, first_path), (other, other_path) = list(seen.items())[:2]
    return (
        f"the dataset's files have other columns: {first_path} has {', '.join(first)}, {other_path} has "
        f"{', '.join(other)}; one dataset takes one layout"
    )


def first_unreadable(files: dict[str, list[str]], builder: str) -> str | None:
    """The first of a dataset's files that its builder cannot read, said in one line."""
    for paths in files.values():
        for path in paths:
            problem = unreadable_part(Path(path), builder)
            if problem:
                return problem
    return None


def unreadable_part(file: Path, builder: str) -> str | None:
    """Which line of a data file stops its builder, for the error message: datasets, pyarrow and pandas
    fail without naming the file (and pyarrow counts rows, not lines), so the file is read again here,
    as the builder reads it, only after a failure. Parquet is binary: only its footer is read."""
    if builder == "parquet":
        return unreadable_parquet(file)
    data = file.read_bytes()
    problem = not_text(file, data)
    if problem:
        return problem
    text = data.decode("utf-8")
    if builder == "json":
        return unreadable_json(file, text)
    if builder == "csv":
        try:
            pd.read_csv(io.StringIO(text))
        except ValueError as error:  # pandas.errors.ParserError is one
            line = re.search(r"\bline (\d+)", str(error))
            where = f" line {line.group(1)}" if line else ""
            return f"{file}{where}: not valid CSV ({first_line(error)})"
    return None


def unreadable_parquet(file: Path) -> str | None:
    try:
        pq.read_metadata(file)
    except (pa.ArrowException, OSError) as error:
        return f"{file}: not a readable Parquet file ({first_line(error)})"
    return None


def not_text(file: Path, data: bytes) -> str | None:
    """Why a file's bytes are not UTF-8 text, naming the line: a binary file or another encoding."""
    nul = data.find(b"\0")
    if nul >= 0:
        return f"{file} line {line_at(data, nul)}: a binary file, not text (a NUL byte)"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        where = f"{file} line {line_at(data, error.start)}"
        return f"{where}: not UTF-8 text ({error.reason} at byte {error.start})"
    return None


def line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def unreadable_json(file: Path, text: str) -> str | None:
    """JSON lines, or one JSON document (as the json builder accepts both)."""
    if text.lstrip().startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            return f"{file} line {error.lineno}: not valid JSON ({error.msg})"
        return None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            return f"{file} line {number}: not valid JSON ({error.msg})"
        if not isinstance(row, dict):
            return f"{file} line {number}: a JSON line must be an object of columns, got {type(row).__name__}"
    return None


def rows_under_one_key(text: str) -> str | None:
    """The key of a file that is one JSON object whose only value is a list of row objects
    (`{"data": [{...}, ...]}`, SQuAD's layout): the json builder reads it as one row. A conversation's
    messages (objects with a role, or ShareGPT's "from") are a row's column, not rows."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not (isinstance(document, dict) and len(document) == 1):
        return None
    ((key, value),) = document.items()
    rows = isinstance(value, list) and value and all(isinstance(row, dict) for row in value)
    messages = rows and any("role" in row or "from" in row for row in value)
    return key if rows and not messages else None


def row_place(source: str, index: int) -> str:
    """Where a row of the data's first split is: the file and its own line for one JSON-lines file
    (blank lines skipped, as the reader skips them), else the source and the row's number."""
    path = Path(source)
    if path.is_file() and path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as stream:
            lines = (number for number, line in enumerate(stream, start=1) if line.strip())
            line = next((number for position, number in enumerate(lines) if position == index), None)
        if line is not None:
            return f"{path} line {line}"
    return f"{source} row {index + 1}"
