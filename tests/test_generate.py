"""finetune generate: completions from a saved model, reproducible for a seed."""

import pytest

from finetune.cli import main as cli_main
from finetune.errors import FinetuneError
from finetune.generate import Sampling, generate, read_prompts


def test_same_seed_same_completion(tiny_gpt2_dir):
    sampling = Sampling(max_new_tokens=12, seed=7)
    first = generate(str(tiny_gpt2_dir), ["Once upon a time"], sampling)
    second = generate(str(tiny_gpt2_dir), ["Once upon a time"], sampling)
    assert first == second
    assert first[0]


def test_another_seed_samples_another_completion(tiny_gpt2_dir):
    prompts = ["Once upon a time"]
    assert generate(str(tiny_gpt2_dir), prompts, Sampling(max_new_tokens=12, seed=1)) != generate(
        str(tiny_gpt2_dir), prompts, Sampling(max_new_tokens=12, seed=2)
    )


def test_one_completion_per_prompt(tiny_gpt2_dir):
    completions = generate(str(tiny_gpt2_dir), ["A", "B", "C"], Sampling(max_new_tokens=4, greedy=True))
    assert len(completions) == 3


def test_prompts_come_from_flags_then_the_file(make_text_file):
    path = make_text_file("prompts.txt", "second\n\nthird\n")
    assert read_prompts(["first"], str(path)) == ["first", "second", "third"]


def test_no_prompt_is_an_error():
    with pytest.raises(FinetuneError, match="at least one --prompt"):
        read_prompts([], None)


def test_generate_command_prints_prompt_and_completion(tiny_gpt2_dir, capsys):
    assert cli_main(["generate", str(tiny_gpt2_dir), "--prompt", "Hello", "--max_new_tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("Hello")
