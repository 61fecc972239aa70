"""Offline-first name resolution: local path, then $FINETUNE_DATA_DIR, then (unless offline) the Hub."""

import pytest

from finetune.errors import FinetuneError
from finetune.models import resolve_model
from finetune.resolve import describe_tried, resolve


def test_existing_local_path_wins_over_the_data_dir(tmp_path, monkeypatch, data_dir):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    found = resolve("gpt2")
    assert (data_dir / "gpt2").is_dir()
    assert found.local_path.resolve() == tmp_path / "gpt2"
    assert found.hub_id is None


def test_name_under_the_data_dir_resolves_there(data_dir):
    found = resolve("tiny-shakespeare")
    assert found.local_path == data_dir / "tiny-shakespeare"
    assert found.local_path is not None


def test_other_local_name_under_the_data_dir_is_found(data_dir):
    found = resolve("wikitext-2-raw-v1", local_names=("wikitext-2-raw-v1", "wikitext-2-v1"))
    assert found.local_path == data_dir / "wikitext-2-v1"


def test_hub_style_model_name_resolves_to_the_data_dir_folder(data_dir):
    assert resolve_model("openai-community/gpt2-medium") == str(data_dir / "gpt2-medium")


def test_unknown_name_offline_has_no_local_path_and_no_hub_id(data_dir):
    found = resolve("no-such-model-xyz")
    assert found.local_path is None
    assert found.hub_id is None
    assert any(str(data_dir) in place for place in found.tried)
    assert "HF_HUB_OFFLINE" in describe_tried(found)


def test_unset_data_dir_is_reported_as_tried(monkeypatch):
    monkeypatch.delenv("FINETUNE_DATA_DIR")
    found = resolve("no-such-model-xyz")
    assert found.local_path is None
    assert any("FINETUNE_DATA_DIR" in place for place in found.tried)


def test_resolve_model_of_an_unknown_name_says_what_it_looked_for(data_dir):
    with pytest.raises(FinetuneError, match="no-such-model-xyz") as error:
        resolve_model("no-such-model-xyz")
    assert str(data_dir / "no-such-model-xyz") in str(error.value)
