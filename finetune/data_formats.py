"""The layouts of a dataset's rows the data pipeline reads: chat, instruction and plain text.

Apart from finetune/instruction.py, which turns them into tokens, so that the command line can name
them (`--data_format`) without importing datasets and transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

# The label of a token no loss is computed on (a prompt, padding): transformers' and torch's convention.
IGNORE_INDEX = -100


@dataclass(frozen=True)
class DataFormat:
    name: str
    columns: tuple[str, ...]  # the columns that identify it (an instruction's input is optional)
    description: str


FORMATS = {
    f.name: f
    for f in (
        DataFormat("messages", ("messages",), "chat messages"),
        DataFormat("sharegpt", ("conversations",), "ShareGPT conversations (from/value)"),
        DataFormat("prompt_completion", ("prompt", "completion"), "prompt/completion"),
        DataFormat("instruction", ("instruction", "output"), "instruction/input/output"),
        DataFormat("question_answer", ("question", "answer"), "question/answer"),
        DataFormat("text", (), "plain text"),
    )
}
DATA_FORMATS = ("auto", *FORMATS)
CHAT_FORMATS = ("messages", "sharegpt")  # conversations: rendered by a chat template, answered in turns
