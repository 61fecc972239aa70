"""finetune generate: completions from a saved model, reproducible for a seed."""

import pytest

from finetune.cli import main as cli_main
from finetune.errors import FinetuneError
from finetune.generate import Chat, Sampling, generate, read_prompts


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


def test_an_empty_prompt_starts_from_the_beginning_of_text_token(tiny_gpt2_dir):
    greedy = Sampling(max_new_tokens=6, greedy=True)
    from_nothing, from_bos = generate(str(tiny_gpt2_dir), ["", "<|endoftext|>"], greedy)
    assert from_nothing == from_bos
    assert from_nothing


def test_max_new_tokens_past_the_models_context_generate_up_to_it_and_say_so(tiny_gpt2_dir, capsys):
    (completion,) = generate(str(tiny_gpt2_dir), ["Hello"], Sampling(max_new_tokens=500, greedy=True))
    assert completion  # GPT-2's learned positions end at n_positions (128): past them, an index error
    expected = "a prompt of 1 tokens leaves room for 127 new tokens in the model's context of 128"
    assert expected in capsys.readouterr().err


def test_prompts_come_from_flags_then_the_file(make_text_file):
    path = make_text_file("prompts.txt", "second\n\nthird\n")
    assert read_prompts(["first"], str(path)) == ["first", "second", "third"]


def test_no_prompt_is_an_error():
    with pytest.raises(FinetuneError, match="at least one --prompt"):
        read_prompts([], None)


def test_a_prompts_file_of_empty_lines_is_an_error_naming_it(make_text_file):
    path = make_text_file("prompts.txt", "\n  \n")
    with pytest.raises(FinetuneError, match=r"prompts\.txt holds no prompt: every line is empty"):
        read_prompts(["given too"], str(path))


def test_a_prompts_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes("first\nsecond caf\u00e9\n".encode("latin-1"))
    with pytest.raises(FinetuneError, match=r"prompts\.txt line 2: not UTF-8 text"):
        read_prompts([], str(path))


def test_generate_command_prints_prompt_and_completion(tiny_gpt2_dir, capsys):
    assert cli_main(["generate", str(tiny_gpt2_dir), "--prompt", "Hello", "--max_new_tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("Hello")


@pytest.fixture
def chat_model_dir(tiny_gpt2_dir, tmp_path):
    """The tiny model with the default chat template saved beside it, as a run on chat data leaves it."""
    import shutil

    from transformers import AutoTokenizer

    from finetune.instruction import DEFAULT_CHAT_TEMPLATE

    folder = tmp_path / "chat-model"
    shutil.copytree(tiny_gpt2_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE.read_text()
    tokenizer.save_pretrained(folder)
    return folder


def test_chat_renders_each_prompt_as_a_user_turn_with_the_assistants_turn_opened(chat_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    rendered = Chat(system="Be brief.").render(tokenizer, "Capital of France?", str(chat_model_dir))
    assert rendered == (
        "<|system|>\nBe brief.<|endoftext|><|user|>\nCapital of France?<|endoftext|><|assistant|>\n"
    )


def test_generate_chat_prints_each_user_prompt_and_the_assistants_answer(chat_model_dir, capsys):
    argv = ["generate", str(chat_model_dir), "--chat", "--prompt", "Hi", "--greedy", "--max_new_tokens", "3"]
    assert cli_main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "user: Hi" and lines[1].startswith("assistant: ")


def test_chat_with_a_model_without_a_chat_template_is_one_error_line(tiny_gpt2_dir, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli_main(["generate", str(tiny_gpt2_dir), "--chat", "--prompt", "Hi"])
    assert stopped.value.code == 2
    assert "has no chat template" in capsys.readouterr().err


def test_a_system_message_without_chat_is_refused(tiny_gpt2_dir, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli_main(["generate", str(tiny_gpt2_dir), "--system", "Be brief.", "--prompt", "Hi"])
    assert stopped.value.code == 2
    assert "add --chat" in capsys.readouterr().err


def test_a_generation_that_fails_after_training_leaves_the_run_completed(
    tmp_path, monkeypatch, capsys, in_process_commands
):
    from finetune import after_training, run
    from finetune.summary import read_summary

    from launching import TINY_MODEL

    def failing(*args, **kwargs):
        raise FinetuneError("cannot load it")

    monkeypatch.setattr(after_training, "generate", failing)
    run.main([
        *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "32", "--batch_size", "2",
        "--max_steps", "2", "--max_eval_samples", "4", "--report_to", "none", "--disable_tqdm", "true",
        "--generation_prompt", "The", "--output_dir", str(tmp_path / "out"),
    ])  # fmt: skip
    assert read_summary(tmp_path / "out")["status"] == "completed"
    assert (
        "--generation_prompt: nothing generated (cannot load it); the run completed"
        in capsys.readouterr().err
    )
