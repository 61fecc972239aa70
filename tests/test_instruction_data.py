"""Instruction and chat data: the format detected from the columns, templates, loss on the answers only."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from finetune.data import IGNORE_INDEX, build_datasets
from finetune.errors import FinetuneError
from finetune.instruction import DEFAULT_CHAT_TEMPLATE, detect_format
from finetune.run import main
from finetune.run_flags import DataArguments
from finetune.summary import read_summary

CHAT = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris"},
    {"role": "user", "content": "And of Italy?"},
    {"role": "assistant", "content": "Rome"},
]


def prepare(path, tokenizer, block_size=128, **options):
    args = DataArguments(dataset=str(path), block_size=block_size, **options)
    return build_datasets(args, tokenizer, block_size, seed=0)


def labelled_spans(tokenizer, sample):
    """Each run of labelled tokens, decoded token by token and joined."""
    spans, current = [], []
    for token, label in zip(sample["input_ids"], sample["labels"], strict=True):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(tokenizer.decode([token]))
        elif current:
            spans.append("".join(current))
            current = []
    if current:
        spans.append("".join(current))
    return spans


def all_spans(tokenizer, dataset):
    return sorted(span for sample in dataset for span in labelled_spans(tokenizer, sample))


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (["text"], "text"),
        (["prompt", "completion"], "prompt_completion"),
        (["instruction", "input", "output"], "instruction"),
        (["instruction", "output"], "instruction"),
        (["question", "answer"], "question_answer"),
        (["messages", "id"], "messages"),
        (["conversations", "id"], "sharegpt"),
    ],
)
def test_the_format_is_detected_from_the_columns(columns, expected):
    assert detect_format(columns, "text").name == expected


def test_data_format_overrides_detection():
    assert detect_format(["text", "question", "answer"], "text", "text").name == "text"


def test_a_requested_format_whose_columns_are_missing_names_them():
    with pytest.raises(FinetuneError, match=r"needs the column\(s\) messages; the dataset has: text"):
        detect_format(["text"], "text", "messages")


def test_columns_that_match_no_format_are_one_error_naming_them(make_jsonl_file, tokenizer):
    path = make_jsonl_file("odd.jsonl", [{"query": "a", "reply": "b"}] * 4)
    with pytest.raises(FinetuneError, match=r"columns match no data format \(columns: query, reply\)"):
        prepare(path, tokenizer)


def test_the_detected_format_is_logged_in_the_notes(make_jsonl_file, tokenizer):
    path = make_jsonl_file("qa.jsonl", [{"question": "1+1?", "answer": "2"}] * 4)
    notes = prepare(path, tokenizer).summary.notes
    assert notes[0] == "data format: question/answer (--data_format question_answer)"


def test_question_answer_trains_on_exactly_each_answer_and_its_eos(make_jsonl_file, tokenizer):
    rows = [
        {"question": f"What is {n} plus {n}?", "answer": f"It is {2 * n}.\n#### {2 * n}"} for n in range(20)
    ]
    data = prepare(make_jsonl_file("qa.jsonl", rows), tokenizer)
    spans = sorted(all_spans(tokenizer, data.train) + all_spans(tokenizer, data.evaluation))
    assert spans == sorted(row["answer"] + "<|endoftext|>" for row in rows)


def test_a_parquet_file_is_read_and_its_format_detected(tmp_path, tokenizer):
    rows = [{"question": f"What is {n} plus {n}?", "answer": f"#### {2 * n}"} for n in range(20)]
    path = tmp_path / "qa.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    data = prepare(path, tokenizer)
    assert data.summary.data_format == "question_answer"
    spans = sorted(all_spans(tokenizer, data.train) + all_spans(tokenizer, data.evaluation))
    assert spans == sorted(row["answer"] + "<|endoftext|>" for row in rows)


def test_instruction_and_input_are_the_prompt(make_jsonl_file, tokenizer):
    rows = [
        {"instruction": "Reverse the word.", "input": f"word{n}", "output": f"{n}drow"} for n in range(10)
    ]
    data = prepare(make_jsonl_file("alpaca.jsonl", rows), tokenizer)
    spans = sorted(all_spans(tokenizer, data.train) + all_spans(tokenizer, data.evaluation))
    assert spans == sorted(row["output"] + "<|endoftext|>" for row in rows)


def test_prompt_and_completion_are_joined_as_given(make_jsonl_file, tokenizer):
    rows = [{"prompt": "The sky is", "completion": " blue."}] * 4
    sample = prepare(make_jsonl_file("pc.jsonl", rows), tokenizer, packing=False).train[0]
    assert tokenizer.decode(sample["input_ids"]) == "The sky is blue.<|endoftext|>"
    assert labelled_spans(tokenizer, sample) == [" blue.<|endoftext|>"]


def test_chat_trains_on_every_assistant_turn_and_nothing_else(make_jsonl_file, tokenizer):
    data = prepare(make_jsonl_file("chat.jsonl", [{"messages": CHAT}] * 4), tokenizer, packing=False)
    assert labelled_spans(tokenizer, data.train[0]) == ["Paris<|endoftext|>", "Rome<|endoftext|>"]


def test_train_on_prompt_labels_every_token_but_the_first(make_jsonl_file, tokenizer):
    rows = [{"question": "Why?", "answer": "Because."}] * 4
    sample = prepare(make_jsonl_file("qa.jsonl", rows), tokenizer, packing=False, train_on_prompt=True).train[
        0
    ]
    assert sample["labels"][0] == IGNORE_INDEX
    assert sample["labels"][1:] == sample["input_ids"][1:]


def test_a_tokenizer_without_a_chat_template_gets_the_default_and_saves_it(
    make_jsonl_file, tokenizer, tmp_path
):
    assert tokenizer.chat_template is None
    prepare(make_jsonl_file("chat.jsonl", [{"messages": CHAT}] * 4), tokenizer)
    tokenizer.save_pretrained(tmp_path / "saved")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert reloaded.chat_template == DEFAULT_CHAT_TEMPLATE.read_text()
    assert reloaded.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=True) == (
        "<|system|>\nAnswer in one word.<|endoftext|><|user|>\nCapital of France?<|endoftext|><|assistant|>\n"
    )


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_tokenizer_with_its_own_chat_template_is_rendered_with_it_and_keeps_it(
    make_jsonl_file, tokenizer, tmp_path
):
    tokenizer.chat_template = CHATML
    path = make_jsonl_file("chat.jsonl", [{"messages": CHAT[1:3]}] * 4)
    sample = prepare(path, tokenizer, packing=False).train[0]
    text = tokenizer.decode(sample["input_ids"])
    assert text == "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\nParis<|im_end|>\n"
    assert labelled_spans(tokenizer, sample) == ["Paris<|im_end|>\n"]
    tokenizer.save_pretrained(tmp_path / "saved")
    assert AutoTokenizer.from_pretrained(tmp_path / "saved").chat_template == CHATML


def test_chat_template_file_renders_the_conversation(make_jsonl_file, make_text_file, tokenizer):
    template = make_text_file(
        "template.jinja",
        "{% for m in messages %}{{ m['role'].upper() }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT: {% endif %}",
    )
    path = make_jsonl_file("chat.jsonl", [{"messages": CHAT[1:3]}] * 4)
    sample = prepare(path, tokenizer, packing=False, chat_template=str(template)).train[0]
    assert tokenizer.decode(sample["input_ids"]) == "USER: Capital of France?\nASSISTANT: Paris\n"
    # tokenized as one string, GPT-2's " Paris" carries the template's space: the answer's first token,
    # as at inference, and trained as transformers' assistant mask would (it overlaps the answer)
    assert labelled_spans(tokenizer, sample) == [" Paris\n"]


def test_a_message_without_a_known_role_is_a_user_error(make_jsonl_file, tokenizer):
    rows = [{"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "yo"}]}] * 4
    with pytest.raises(FinetuneError, match="role among system, user, assistant"):
        prepare(make_jsonl_file("chat.jsonl", rows), tokenizer)


def test_a_message_whose_content_is_not_text_names_its_role_and_value(make_jsonl_file, tokenizer):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}] * 4
    with pytest.raises(FinetuneError, match="line 1: the assistant message's content must be text, got None"):
        prepare(make_jsonl_file("chat.jsonl", rows), tokenizer)


def test_the_summary_counts_trained_and_masked_tokens(make_jsonl_file, tokenizer):
    rows = [{"question": "one two three", "answer": "four five"}] * 20
    summary = prepare(make_jsonl_file("qa.jsonl", rows), tokenizer, packing=False).summary
    prompt = len(tokenizer("one two three\n")["input_ids"])
    answer = len(tokenizer("four five<|endoftext|>")["input_ids"])
    assert (summary.train_tokens, summary.masked_tokens) == (
        summary.train_samples * answer,
        summary.train_samples * prompt,
    )


def test_over_long_examples_are_truncated_and_counted(make_jsonl_file, tokenizer):
    rows = [{"question": "q", "answer": "word " * 100}] * 3 + [{"question": "q", "answer": "short"}] * 5
    make_jsonl_file("qa/validation.jsonl", rows[-2:])
    data = prepare(make_jsonl_file("qa/train.jsonl", rows).parent, tokenizer, block_size=32, packing=False)
    assert data.summary.truncated_examples == 3
    assert [len(sample["input_ids"]) for sample in data.train][:3] == [32, 32, 32]
    assert "3 train examples longer than 32 tokens were truncated" in data.summary.notes


def test_a_run_on_instruction_data_trains_and_records_the_data_fields(
    make_jsonl_file, tiny_gpt2_dir, output_flags
):
    rows = [{"question": f"{n} plus {n}?", "answer": f"#### {2 * n}"} for n in range(40)]
    path = make_jsonl_file("qa.jsonl", rows)
    main(
        [
            *("--model", str(tiny_gpt2_dir), "--dataset", str(path), "--block_size", "64"),
            *("--max_steps", "2", "--batch_size", "2", "--use_cpu", "--save_strategy", "no", *output_flags),
        ]
    )
    summary = read_summary(output_flags[output_flags.index("--output_dir") + 1])
    assert summary["status"] == "completed"
    assert summary["data_format"] == "question_answer"
    assert summary["train_tokens"] > 0 and summary["masked_tokens"] > 0
    assert 0 < summary["packing_efficiency"] <= 1
    assert summary["truncated_examples"] == 0


def test_answers_that_are_numbers_train_as_their_digits(make_text_file, tokenizer):
    rows = "".join(f"What is {n} plus 1?,{n + 1}\n" for n in range(20))
    data = prepare(make_text_file("sums.csv", "question,answer\n" + rows), tokenizer, packing=False)
    spans = sorted(all_spans(tokenizer, data.train) + all_spans(tokenizer, data.evaluation))
    assert spans == sorted(f"{n + 1}<|endoftext|>" for n in range(20))


def test_rows_without_an_answer_are_left_out_with_a_note(make_text_file, tokenizer):
    """A CSV column with empty cells arrives as floats with NaN: 3.0 is still the answer "3"."""
    rows = "".join(f"What is {n} plus 1?,{'' if n % 4 == 0 else n + 1}\n" for n in range(40))
    path = make_text_file("sums.csv", "question,answer\n" + rows)
    data = prepare(path, tokenizer, packing=False, validation_split_percentage=25)
    spans = sorted(all_spans(tokenizer, data.train) + all_spans(tokenizer, data.evaluation))
    assert spans == sorted(f"{n + 1}<|endoftext|>" for n in range(40) if n % 4)
    assert any("have no answer (an empty one" in note for note in data.summary.notes)


def test_a_file_whose_answers_are_all_empty_is_one_error(make_text_file, tokenizer):
    path = make_text_file("empty.csv", "question,answer\n" + "".join(f"q{n}?,\n" for n in range(20)))
    with pytest.raises(FinetuneError, match="has an answer to train on"):
        prepare(path, tokenizer)


CHATML_TRIMMED = (  # as transformers' ChatML renders it: trim_blocks leaves nothing between the turns
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MULTI_TURN = [
    message
    for n in range(3)
    for message in (
        {"role": "user", "content": f"What is {n} plus {n}?"},
        {"role": "assistant", "content": f"{2 * n}."},
    )
]  # fmt: skip


@pytest.mark.parametrize(
    "template", [CHATML_TRIMMED, DEFAULT_CHAT_TEMPLATE.read_text()], ids=["chatml", "default"]
)
def test_training_ids_are_the_ids_of_the_rendered_conversation(make_jsonl_file, tokenizer, template):
    """What apply_chat_template(tokenize=True) gives at inference, boundary tokens included."""
    tokenizer.chat_template = template
    path = make_jsonl_file("chat.jsonl", [{"messages": MULTI_TURN}] * 4)
    sample = prepare(path, tokenizer, packing=False).train[0]
    expected = tokenizer.apply_chat_template(MULTI_TURN, tokenize=True, return_dict=False)
    assert sample["input_ids"] == list(expected)


def test_trained_tokens_are_transformers_assistant_tokens(make_jsonl_file, tokenizer):
    """The mask TRL's assistant_only_loss uses: the template's {% generation %} blocks, by offsets."""
    marked = CHATML_TRIMMED.replace(
        "{{ m['content'] }}<|im_end|>",
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}"
        "{% else %}{{ m['content'] }}<|im_end|>{% endif %}",
    )
    tokenizer.chat_template = marked
    path = make_jsonl_file("chat.jsonl", [{"messages": MULTI_TURN}] * 4)
    sample = prepare(path, tokenizer, packing=False).train[0]
    reference = tokenizer.apply_chat_template(
        MULTI_TURN, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert sample["input_ids"] == list(reference["input_ids"])
    trained = [label != IGNORE_INDEX for label in sample["labels"]]
    assert trained[1:] == [bool(mask) for mask in reference["assistant_masks"]][1:]


SHAREGPT = [
    {"from": "system", "value": "Answer in one word."},
    {"from": "human", "value": "Capital of France?"},
    {"from": "gpt", "value": "Paris"},
    {"from": "human", "value": "And of Italy?"},
    {"from": "gpt", "value": "Rome"},
]


def test_sharegpt_conversations_train_on_every_gpt_turn_as_chat_messages_do(make_jsonl_file, tokenizer):
    path = make_jsonl_file("sharegpt.jsonl", [{"conversations": SHAREGPT, "id": "a"}] * 4)
    data = prepare(path, tokenizer, packing=False)
    assert labelled_spans(tokenizer, data.train[0]) == ["Paris<|endoftext|>", "Rome<|endoftext|>"]
    chat = prepare(make_jsonl_file("chat.jsonl", [{"messages": CHAT}] * 4), tokenizer, packing=False)
    assert data.train[0]["input_ids"] == chat.train[0]["input_ids"]


def test_a_sharegpt_speaker_it_does_not_know_is_one_error(make_jsonl_file, tokenizer):
    turns = [{"from": "narrator", "value": "Once"}, {"from": "gpt", "value": "upon"}]
    expected = r"sharegpt\.jsonl line 1: every turn needs a 'from' among system, human"
    with pytest.raises(FinetuneError, match=expected):
        prepare(make_jsonl_file("sharegpt.jsonl", [{"conversations": turns}] * 4), tokenizer)


QA = [{"question": f"What is {n} plus {n}?", "answer": f"{2 * n}"} for n in range(20)]


def test_question_answer_goes_through_the_tokenizers_own_chat_template(make_jsonl_file, tokenizer):
    tokenizer.chat_template = CHATML_TRIMMED
    data = prepare(make_jsonl_file("qa.jsonl", QA), tokenizer, packing=False)
    text = tokenizer.decode(data.train[0]["input_ids"])
    assert text.startswith("<|im_start|>user\nWhat is") and "<|im_start|>assistant\n" in text
    assert any("rendered through the tokenizer's chat template" in note for note in data.summary.notes)


def test_an_explicit_data_format_keeps_the_plain_layout(make_jsonl_file, tokenizer):
    tokenizer.chat_template = CHATML_TRIMMED
    data = prepare(make_jsonl_file("qa.jsonl", QA), tokenizer, packing=False, data_format="question_answer")
    assert "<|im_start|>" not in tokenizer.decode(data.train[0]["input_ids"])


def test_a_template_whose_answers_end_untrained_is_noted(make_jsonl_file, tokenizer):
    """The end of each turn rendered in the next turn's text: nothing teaches the model to stop."""
    tokenizer.chat_template = (
        "{% for m in messages %}{% if not loop.first %}<|endoftext|>{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|endoftext|>assistant: {% endif %}"
    )
    data = prepare(make_jsonl_file("chat.jsonl", [{"messages": CHAT[1:3]}] * 8), tokenizer, packing=False)
    assert any("will not learn to stop" in note for note in data.summary.notes)


def test_answers_ending_with_a_trained_end_of_turn_are_not_noted(make_jsonl_file, tokenizer):
    data = prepare(make_jsonl_file("chat.jsonl", [{"messages": CHAT}] * 4), tokenizer, packing=False)
    assert not any("will not learn to stop" in note for note in data.summary.notes)


def test_a_bad_chat_row_is_named_by_its_file_and_its_own_line(make_text_file, tokenizer):
    good = json.dumps({"messages": CHAT})
    bad = json.dumps(
        {"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    )
    path = make_text_file("chat.jsonl", "\n".join([good, good, "", good, bad, good]) + "\n")
    with pytest.raises(FinetuneError, match=rf"{re.escape(str(path))} line 5: every message needs a role"):
        prepare(path, tokenizer)


def test_chat_rows_of_two_layouts_in_one_file_are_named_as_mixed_layouts(make_text_file, tokenizer):
    messages = json.dumps({"messages": CHAT})
    sharegpt = json.dumps(
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    )
    path = make_text_file("chat.jsonl", "\n".join([messages, messages, sharegpt]) + "\n")
    expected = rf"{re.escape(str(path))} line 3: it has no 'messages' .* but 'conversations': one dataset"
    with pytest.raises(FinetuneError, match=expected):
        prepare(path, tokenizer)


HOSTILE_TEMPLATES = {
    "{% include 'x.jinja' %}": "{% include %} reads another template",
    "{% import 'x.jinja' as x %}{{ messages }}": "{% import %} reads another template",
    "{{ 7 ** 300000000 }}": "'**' is refused",
    "{{ 'a' * 1000000000 }}": "repeating a string by a number is refused",
    "{% for m in messages %}{{ m['content'] }": "not a Jinja template",
}


@pytest.mark.parametrize("template", sorted(HOSTILE_TEMPLATES))
def test_a_chat_template_that_reads_other_files_or_has_no_bound_is_refused_before_rendering(template):
    from finetune.instruction import check_chat_template

    with pytest.raises(FinetuneError, match=re.escape(HOSTILE_TEMPLATES[template])):
        check_chat_template(template, "--chat_template t.jinja")


def test_the_shipped_and_generation_marking_templates_pass_the_check():
    from finetune.instruction import DEFAULT_CHAT_TEMPLATE, check_chat_template

    check_chat_template(DEFAULT_CHAT_TEMPLATE.read_text(), "default")
    marked = "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    assert check_chat_template(marked, "marked") == marked


def test_a_range_the_sandbox_refuses_is_one_line_naming_the_row(make_jsonl_file, make_text_file, tokenizer):
    path = make_jsonl_file("chat.jsonl", [{"messages": CHAT}] * 2)
    template = make_text_file("big.jinja", "{% for i in range(1000000000) %}x{% endfor %}")
    with pytest.raises(FinetuneError, match="row 1: the chat template cannot render it \\(OverflowError"):
        prepare(path, tokenizer, chat_template=str(template))
