"""Model shapes from configs alone: the GPT-2 sizes and the larger ladder are built in, so plans of
them need no config files; a run's own model is read from its config, its overrides applied."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from finetune.model_shapes import GPT2_SIZES, gpt2_shape, model_config
from finetune.workload import ModelShape


@pytest.mark.parametrize("name", list(GPT2_SIZES))
def test_a_built_in_gpt2_size_counts_as_its_config_folder_does(name, data_dir):
    from_folder = ModelShape.from_config(name, AutoConfig.from_pretrained(data_dir / name))
    assert gpt2_shape(name) == from_folder


def test_ladder_shapes_are_counted_like_their_names_say():
    assert gpt2_shape("gpt-6.7b").parameters == pytest.approx(6.7e9, rel=0.02)
    assert gpt2_shape("gpt-13b").parameters == pytest.approx(13e9, rel=0.02)


def test_overrides_apply_to_a_built_in_size_without_its_folder(monkeypatch):
    monkeypatch.delenv("FINETUNE_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = model_config("gpt2-xl", "n_layer=2")
    assert (config.n_layer, config.n_embd, config.n_head) == (2, 1600, 25)
