"""The user's YAML and JSON files (recipes, profiles, DeepSpeed configs) read with each key given once.

PyYAML and json keep the last of two equal keys without a word, so a file edited by adding a key it
already had trains with whichever came last. YAML requires keys to be unique and DeepSpeed's own
reader of a JSON file refuses a repeated one (`dict_raise_error_on_duplicate_keys`), but accelerate
hands DeepSpeed the config already parsed: these readers refuse them for every file a run reads.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from finetune.errors import FinetuneError, first_line


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # SafeLoader's own mapping refuses it, with its line
            if key in first_line:
                problem = f"'{key}' is given twice (first on line {first_line[key]})"
                raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, path: Path) -> Any:
    """yaml.safe_load, refusing a key given twice in one mapping; any problem one line naming the file
    and, where YAML knows it, the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader's subclass: builds no Python objects
    except yaml.MarkedYAMLError as error:
        where = f" line {error.problem_mark.line + 1}" if error.problem_mark else ""
        raise FinetuneError(f"{path}{where}: not valid YAML ({error.problem or error.context})") from None
    except yaml.YAMLError as error:
        raise FinetuneError(f"{path}: not valid YAML ({first_line(error)})") from None


def parse_json(text: str, path: Path) -> Any:
    """json.loads, refusing a key given twice in one object; any problem one line naming the file."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except ValueError as error:  # json.JSONDecodeError is one
        raise FinetuneError(f"{path}: not valid JSON ({error})") from None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"'{key}' is given twice in one object")
        result[key] = value
    return result
