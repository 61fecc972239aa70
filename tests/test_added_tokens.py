"""A tokenizer with added tokens (ChatML's) trains: the embeddings grow to it, under ddp and ZeRO-3."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from finetune import run
from finetune.summary import read_summary

from launching import accelerate_launch, launch

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY = ["--model", "gpt2", "--from_scratch", "--config_overrides", "n_layer=2,n_embd=64,n_head=2"]


@pytest.fixture(scope="module")
def chatml_tokenizer(tmp_path_factory, data_dir):
    folder = tmp_path_factory.mktemp("chatml-tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(data_dir / "gpt2")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"What is {n} plus {n}?"},
                      {"role": "assistant", "content": f"{2 * n}."}]}
        for n in range(40)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def flags(tokenizer, data, output_dir) -> list[str]:
    return [*TINY, "--tokenizer", str(tokenizer), "--dataset", str(data), "--block_size", "64",
            "--max_steps", "3", "--batch_size", "2", "--max_eval_samples", "4", "--save_strategy", "no",
            "--report_to", "none", "--disable_tqdm", "true", "--output_dir", str(output_dir)]  # fmt: skip


def test_added_tokens_grow_the_embeddings_and_the_saved_model_keeps_them(
    chatml_tokenizer, chat_file, tmp_path, in_process_commands
):
    output_dir = tmp_path / "out"
    run.main(flags(chatml_tokenizer, chat_file, output_dir))
    assert read_summary(output_dir)["embeddings_resized_to"] == 50259
    assert json.loads((output_dir / "config.json").read_text())["vocab_size"] == 50259
    weights = load_file(output_dir / "model.safetensors")
    assert weights["transformer.wte.weight"].shape[0] == 50259
    assert torch.isfinite(weights["transformer.wte.weight"][-2:]).all()


def test_adapters_with_added_tokens_are_one_line_before_the_data(
    chatml_tokenizer, chat_file, tmp_path, tiny_gpt2_dir, capsys, in_process_commands
):
    argv = [
        "--model",
        str(tiny_gpt2_dir),
        "--peft",
        "lora",
        *flags(chatml_tokenizer, chat_file, tmp_path / "o")[5:],
    ]
    with pytest.raises(SystemExit) as stopped:
        run.main(argv)
    assert stopped.value.code == 2
    assert "adapters cannot learn the new tokens' embeddings" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.parametrize("profile", ["ddp", "zero3"])
def test_two_ranks_train_with_added_tokens(profile, chatml_tokenizer, chat_file, tmp_path):
    output_dir = tmp_path / "out"
    launch(accelerate_launch(profile), output_dir, flags(chatml_tokenizer, chat_file, output_dir)[:-2])
    summary = read_summary(output_dir)
    assert (summary["status"], summary["embeddings_resized_to"]) == ("completed", 50259)
    assert load_file(output_dir / "model.safetensors")["transformer.wte.weight"].shape[0] == 50259
