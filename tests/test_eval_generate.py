"""`finetune eval --generate`: each test prompt, rendered as in training without its answer, completed
greedily, and the extracted answer compared with the reference's; reported beside the answer-only loss."""

import json
import random
from pathlib import Path

import pytest
from datasets import load_dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast

from finetune import cli
from finetune.errors import FinetuneError
from finetune.evaluation import AnswerCheck, prompts_and_references
from finetune.generate import complete_greedily, completion_text
from finetune.instruction import DEFAULT_CHAT_TEMPLATE, encode, end_of_turn_ids
from finetune.run import main

CHAT = [
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris"},
    {"role": "user", "content": "And of Italy?"},
    {"role": "assistant", "content": "Rome"},
]


def load_rows(path):
    return load_dataset("json", data_files=str(path))["train"]


def eval_line(capsys, *flags):
    """The JSON line `finetune eval FLAGS` prints."""
    capsys.readouterr()
    assert cli.main(["eval", *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_pattern_extracts_its_first_group():
    assert AnswerCheck("#### (.+)", 8).extract("6 + 6 = 12.\n#### 12 \n") == "12"


def test_without_a_pattern_the_answer_is_the_whole_stripped_text():
    assert AnswerCheck(None, 8).extract("  Paris\n") == "Paris"


def test_a_completion_the_pattern_does_not_match_has_no_answer():
    assert AnswerCheck("#### (.+)", 8).extract("twelve") is None


def test_an_invalid_pattern_is_a_user_error():
    with pytest.raises(FinetuneError, match="not a regular expression"):
        AnswerCheck("#### (.+", 8)


def test_the_prompt_is_the_question_as_trained_and_the_reference_its_answer(make_jsonl_file, tokenizer):
    rows = make_jsonl_file("qa.jsonl", [{"question": "What is 6 + 6?", "answer": "6 + 6 = 12.\n#### 12"}])
    encoded = encode(load_rows(rows), "question_answer", tokenizer, "", False, "test")
    prompts, references, truncated = prompts_and_references(encoded, tokenizer, room=100)
    assert prompts[0] == tokenizer("What is 6 + 6?\n")["input_ids"]
    assert (references, truncated) == (["6 + 6 = 12.\n#### 12"], 0)


def test_a_chat_prompt_is_the_conversation_up_to_the_last_assistant_turn(make_jsonl_file, tokenizer):
    rows = make_jsonl_file("chat.jsonl", [{"messages": CHAT}])
    encoded = encode(load_rows(rows), "messages", tokenizer, DEFAULT_CHAT_TEMPLATE.read_text(), False, "test")
    prompts, references, _ = prompts_and_references(encoded, tokenizer, room=100)
    assert tokenizer.decode(prompts[0]) == (
        "<|user|>\nCapital of France?<|endoftext|><|assistant|>\nParis<|endoftext|>"
        "<|user|>\nAnd of Italy?<|endoftext|><|assistant|>\n"
    )
    assert references == ["Rome"]


def test_a_prompt_longer_than_the_room_keeps_its_end_and_is_counted(make_jsonl_file, tokenizer):
    rows = make_jsonl_file("qa.jsonl", [{"question": "one two three four", "answer": "five"}])
    encoded = encode(load_rows(rows), "question_answer", tokenizer, "", False, "test")
    prompts, _, truncated = prompts_and_references(encoded, tokenizer, room=2)
    assert (tokenizer.decode(prompts[0]), truncated) == (" four\n", 1)


def test_batched_left_padded_completions_equal_one_prompt_at_a_time(tiny_gpt2_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    prompts = [tokenizer(text)["input_ids"] for text in ("Hello", "The cat sat on the", "One two three four")]
    alone = [complete_greedily(model, tokenizer, [prompt], 6, batch_size=1)[0] for prompt in prompts]
    assert complete_greedily(model, tokenizer, prompts, 6, batch_size=3) == alone


def test_generate_on_plain_text_is_a_user_error(tiny_gpt2_dir, make_text_file):
    data = make_text_file("text/train.txt", "some text\n" * 50)
    make_text_file("text/validation.txt", "more text\n" * 10)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["eval", str(tiny_gpt2_dir), "--dataset", str(data.parent), "--generate"])
    assert stopped.value.code == 2


def test_answer_pattern_without_generate_is_a_user_error(tiny_gpt2_dir, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["eval", str(tiny_gpt2_dir), "--answer_pattern", "#### (.+)"])
    assert stopped.value.code == 2
    assert "add --generate" in capsys.readouterr().err


def test_a_reference_the_pattern_does_not_match_is_a_user_error(tiny_gpt2_dir, make_jsonl_file, capsys):
    path = make_jsonl_file("qa/test.jsonl", [{"question": "1 + 1?", "answer": "2"}] * 3)
    with pytest.raises(SystemExit) as stopped:
        cli.main(
            [
                *("eval", str(tiny_gpt2_dir), "--dataset", str(path), "--split", "train", "--generate"),
                *("--answer_pattern", "#### (.+)", "--max_new_tokens", "8"),
            ]
        )
    assert stopped.value.code == 2
    assert "finds no answer in 3 of 3 references" in capsys.readouterr().err


def character_tokenizer():
    """One token per character of the digit task: a GPT-2 head over 14 tokens instead of 50,257
    keeps the training below in seconds on a CPU."""
    vocabulary = ["<|endoftext|>", "\n", " ", "#", *"0123456789"]
    model = models.WordLevel({token: index for index, token in enumerate(vocabulary)}, unk_token="#")
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")


def digit_reversals(count, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        digits = [str(rng.randrange(10)) for _ in range(3)]
        rows.append({"question": " ".join(digits), "answer": "#### " + " ".join(reversed(digits))})
    return rows


def train_digit_model(
    tmp_path, make_jsonl_file, output_flags, tokenizer, rows_of, extra: tuple[str, ...] = ()
) -> tuple[str, Path]:
    """A 2-layer GPT-2 over the tokenizer, trained 300 steps on 2,000 digit reversals (`rows_of(count,
    seed)` writes them in a format): its output_dir and the data folder (50 unseen test rows)."""
    model = tmp_path / "model"
    tokenizer.save_pretrained(model)
    GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        n_positions=64,
        vocab_size=len(tokenizer),
        bos_token_id=0,
        eos_token_id=0,
    ).save_pretrained(model)
    make_jsonl_file("digits/train.jsonl", rows_of(2000, seed=0))
    make_jsonl_file("digits/validation.jsonl", rows_of(20, seed=1))
    data = make_jsonl_file("digits/test.jsonl", rows_of(50, seed=2)).parent
    main(
        [
            *("--model", str(model), "--from_scratch", "--dataset", str(data), "--block_size", "64"),
            *("--max_steps", "300", "--batch_size", "8", "--learning_rate", "3e-3", "--warmup_steps", "10"),
            *("--use_cpu", "--save_strategy", "no", "--eval_strategy", "no", "--disable_tqdm", "true"),
            *output_flags,
            *extra,
        ]
    )
    return output_flags[output_flags.index("--output_dir") + 1], data


@pytest.mark.integration
def test_a_tiny_model_trained_to_reverse_digits_answers_well_above_chance(
    tmp_path, make_jsonl_file, output_flags, capsys, in_process_commands
):
    """Three random digits, reversed after '#### ': a guess is right with chance 1/1000; the trained
    model must get at least half of 50 unseen prompts exactly right."""
    output_dir, data = train_digit_model(
        tmp_path, make_jsonl_file, output_flags, character_tokenizer(), digit_reversals
    )
    result = eval_line(
        capsys,
        *(output_dir, "--dataset", str(data), "--split", "test", "--generate"),
        *("--answer_pattern", "#### (.+)", "--max_new_tokens", "12"),
    )
    assert (result["data_format"], result["exact_match_total"]) == ("question_answer", 50)
    assert result["exact_match"] >= 0.5, result
    assert result["exact_match_correct"] == round(result["exact_match"] * 50)
    assert result["loss"] < 1.0


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_character_tokenizer():
    tokenizer = character_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    return tokenizer


def test_the_end_of_turn_of_a_chatml_template_is_its_im_end_token():
    tokenizer = chatml_character_tokenizer()
    assert end_of_turn_ids(tokenizer) == [
        tokenizer.eos_token_id,
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]


def test_the_default_template_ends_turns_with_eos_alone(tokenizer):
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE.read_text()
    assert end_of_turn_ids(tokenizer) == [tokenizer.eos_token_id]


def test_a_completion_ends_at_its_first_end_of_turn_or_stop_text():
    tokenizer = chatml_character_tokenizer()
    ids = tokenizer("#### 3 2 1<|im_end|>\n#### 9<|im", add_special_tokens=False)["input_ids"]
    assert completion_text(tokenizer, ids, end_of_turn_ids(tokenizer), ()) == "#### 3 2 1"
    assert completion_text(tokenizer, ids, [], (" 2",)) == "#### 3"


def chat_reversals(count, seed):
    return [
        {
            "messages": [
                {"role": "user", "content": row["question"]},
                {"role": "assistant", "content": row["answer"]},
            ]
        }
        for row in digit_reversals(count, seed)
    ]


@pytest.mark.integration
def test_a_chatml_model_stops_at_its_end_of_turn_and_its_right_answers_count(
    tmp_path, make_jsonl_file, output_flags, capsys, in_process_commands
):
    """Trained on ChatML turns ending in <|im_end|>: generation stops there, so a right answer is not
    followed by a next turn that the pattern would read as part of it."""
    tokenizer = chatml_character_tokenizer()
    output_dir, data = train_digit_model(
        tmp_path, make_jsonl_file, output_flags, tokenizer, chat_reversals, ("--generation_prompt", "1 2 3")
    )
    # what generate(), pipelines and inference servers read: the turn's end is an end of generation
    saved = json.loads((Path(output_dir) / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in saved["eos_token_id"]
    # --generation_prompt on a chat run is a user's message, answered in the trained format
    (generation,) = json.loads((Path(output_dir) / "run_summary.json").read_text())["generations"]
    assert generation["completion"].startswith("#### "), generation
    result = eval_line(
        capsys,
        *(
            output_dir,
            "--dataset",
            str(data),
            "--split",
            "test",
            "--generate",
            "--output",
            str(tmp_path / "r.json"),
        ),
        *("--answer_pattern", "#### (.+)", "--max_new_tokens", "24"),
    )
    assert result["data_format"] == "messages" and result["exact_match"] >= 0.5, result
    records = [json.loads(line) for line in (tmp_path / "r.completions.jsonl").read_text().splitlines()]
    assert (
        len(records) == 50 and sum(record["correct"] for record in records) == result["exact_match_correct"]
    )
    assert {"prompt", "completion", "answer", "reference"} <= set(records[0])
    assert not any("im_start" in record["completion"] or "\n" in record["completion"] for record in records)
    capsys.readouterr()
    assert (
        cli.main(
            ["generate", output_dir, "--chat", "--prompt", "1 2 3", "--greedy", "--max_new_tokens", "24"]
        )
        == 0
    )
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("assistant: #### ")
