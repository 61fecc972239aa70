"""Instruction and chat data: which format a dataset is in, its text, and labels on the answers only.

Every example becomes segments of text, each trained on or not: the prompt (system and user turns,
the question, the instruction) is not, the answer (each assistant turn, the completion) is. Each
segment is tokenized on its own and the ids are concatenated, so a label boundary is a token boundary
and the labelled tokens decode to exactly the answer (the price: a word split across the boundary is
tokenized as two pieces, as TRL's prompt-completion path does too).

Chat data goes through the tokenizer's chat template, or --chat_template FILE, or, for tokenizers
without one (GPT-2), `templates/default_chat.jinja`. The assistant turns are found by rendering the
conversation up to each of them (with and without the generation prompt), which works with any
template that renders a conversation as a prefix of its continuation; transformers'
`return_assistant_tokens_mask` would need `{% generation %}` markers most published templates lack.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jinja2
import pyarrow.compute as pc
from datasets import Dataset
from jinja2 import nodes
from jinja2.ext import Extension
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from finetune.data_formats import CHAT_FORMATS, FORMATS, IGNORE_INDEX, DataFormat
from finetune.errors import FinetuneError, first_line

DEFAULT_CHAT_TEMPLATE = Path(__file__).with_name("templates") / "default_chat.jinja"
# Between a non-chat prompt (question, instruction and input) and its answer.
SEPARATOR = "\n"
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT's speakers ("from") as chat roles: the names its exports and the fine-tuning tools use.
SHAREGPT_ROLES = {
    "system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "tool": "tool", "observation": "tool",
    "function_response": "tool",
}  # fmt: skip


def detect_format(columns: Iterable[str], text_column: str, requested: str = "auto") -> DataFormat:
    """The one asked for, else the first of FORMATS whose columns are all there, else plain text."""
    present = set(columns)
    if requested != "auto":
        chosen = FORMATS[requested]
        needed = chosen.columns or (text_column,)
        missing = [name for name in needed if name not in present]
        if missing:
            raise FinetuneError(
                f"--data_format {requested} needs the column(s) {', '.join(missing)}; "
                f"the dataset has: {', '.join(sorted(present))}"
            )
        return chosen
    for candidate in FORMATS.values():
        if candidate.columns and set(candidate.columns) <= present:
            return candidate
    if text_column in present:
        return FORMATS["text"]
    expected = "; ".join(" + ".join(f.columns) for f in FORMATS.values() if f.columns)
    raise FinetuneError(
        f"the dataset's columns match no data format (columns: {', '.join(sorted(present))}): expected "
        f"'{text_column}' (plain text, --text_column), or {expected}"
    )


TURN_SENTINEL = "\u2063finetune-turn\u2063"  # text no template adds: where an assistant turn's content ends


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokens that end a model's answer: EOS, and the special token the tokenizer's chat template
    puts right after an assistant turn's content (ChatML's <|im_end|>), which generation must stop at
    as it stops at EOS, or it runs on into a next turn."""
    stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if not tokenizer.chat_template:
        return stops
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": TURN_SENTINEL}]
    try:
        rendered = tokenizer.apply_chat_template(turn, tokenize=False)
    except Exception:  # a template that cannot render this pair (it asks for a system turn, say)
        return stops
    after = rendered.split(TURN_SENTINEL, 1)[-1]
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    if ids and ids[0] in special and ids[0] not in stops:
        stops.append(ids[0])
    return stops


def template_for(
    data_format: str, requested: str, tokenizer: PreTrainedTokenizerBase, path: str | None
) -> str:
    """The chat template examples are rendered with ("" for the plain layout): chat data always; a
    prompt/answer format when detected (not asked for) and the tokenizer brings its own template."""
    chat = data_format in CHAT_FORMATS
    if chat or (requested == "auto" and bool(tokenizer.chat_template)):
        return chat_template_for(tokenizer, path)
    return ""


def chat_template_for(tokenizer: PreTrainedTokenizerBase, path: str | None) -> str:
    """--chat_template, else the tokenizer's own template, else the project's default."""
    if path:
        try:
            return check_chat_template(Path(path).read_text(), f"--chat_template {path}")
        except OSError as error:
            raise FinetuneError(f"--chat_template {path}: cannot read it ({error.strerror})") from None
    return tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE.read_text()


class GenerationBlocks(Extension):
    """Parses transformers' `{% generation %}...{% endgeneration %}` (its AssistantTracker's tag)."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it so)

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def check_chat_template(template: Any, origin: str) -> Any:
    """A chat template read from a file or a model folder is data: refuse, before anything renders it,
    what Jinja's sandbox lets through but a template never needs: reading other templates
    (`{% include %}`, `{% import %}`, `{% extends %}`), `**` (7 ** 300000000 runs for minutes) and
    repeating a string by a number ('a' * 1000000000 takes gigabytes). Other sandbox refusals
    (`range(10**9)`) are one line where a template is rendered. Returns the template."""
    for text in template.values() if isinstance(template, dict) else [template]:
        if not isinstance(text, str):
            raise FinetuneError(f"{origin}: a chat template must be text")
        try:
            tree = jinja2.Environment(extensions=[GenerationBlocks, "jinja2.ext.loopcontrols"]).parse(text)
        except jinja2.TemplateSyntaxError as error:
            raise FinetuneError(
                f"{origin}: not a Jinja template (line {error.lineno}: {error.message})"
            ) from None
        for kind, what in ((nodes.Include, "include"), (nodes.Import, "import"), (nodes.FromImport, "import"),
                           (nodes.Extends, "extends")):  # fmt: skip
            if tree.find(kind) is not None:
                raise FinetuneError(
                    f"{origin}: {{% {what} %}} reads another template, which a chat template cannot"
                )
        if tree.find(nodes.Pow) is not None:
            raise FinetuneError(
                f"{origin}: '**' is refused in a chat template (its time and memory have no bound)"
            )
        for product in tree.find_all(nodes.Mul):
            if any(
                isinstance(side, nodes.Const) and isinstance(side.value, str)
                for side in (product.left, product.right)
            ):
                raise FinetuneError(f"{origin}: repeating a string by a number is refused in a chat template")
    return template


def sharegpt_messages(conversations: Any, row: int) -> list[dict[str, str]]:
    """A ShareGPT row's `conversations` ([{from, value}]) as chat messages."""
    if not isinstance(conversations, list) or not conversations:
        raise FinetuneError(f"row {row}: 'conversations' must be a non-empty list of {{from, value}}")
    messages = []
    for turn in conversations:
        speaker = turn.get("from") if isinstance(turn, dict) else None
        if speaker not in SHAREGPT_ROLES:
            raise FinetuneError(
                f"row {row}: every turn needs a 'from' among {', '.join(SHAREGPT_ROLES)}, got {turn!r:.80}"
            )
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn.get("value")})
    return messages


def first_bad_row(dataset: Dataset, data_format: str, text_column: str) -> tuple[int, str] | None:
    """The first row (index, problem) that cannot be rendered, checked before the data is split, while
    a row's index is still its place in the file: a chat that is not one, or a null plain text (which
    would fail deep in packing as a pyarrow error). A null prompt or answer is an empty one (`as_text`)."""
    if data_format == "text":
        return first_null(dataset, text_column) or first_not_text(dataset, text_column)
    if data_format not in ("messages", "sharegpt"):
        return None
    column = "messages" if data_format == "messages" else "conversations"
    others = [name for name in dataset.column_names if name != column]
    for index, value in enumerate(dataset[column]):
        if value is None:  # the file mixes layouts: datasets gave this row's missing column a null
            row = dataset[index]
            held = [name for name in others if row[name] is not None]
            return index, (
                f"it has no '{column}' (the layout of the first rows) but {', '.join(map(repr, held))}: "
                "one dataset takes one layout"
            )
        try:
            check_messages(
                value if data_format == "messages" else sharegpt_messages(value, index + 1), index + 1
            )
        except FinetuneError as error:
            return index, str(error).split(": ", 1)[-1]
    return None


def first_null(dataset: Dataset, column: str) -> tuple[int, str] | None:
    """Found with pyarrow, not a Python loop over the rows: datasets of millions of rows are checked too."""
    values = dataset.data.column(column)
    if not values.null_count:
        return None
    return pc.index(pc.is_null(values), True).as_py(), f"its '{column}' is empty (null), not text"


def first_not_text(dataset: Dataset, column: str) -> tuple[int, str] | None:
    """The first row that is not text in a column of JSON values of mixed types (datasets' `Json`
    feature: texts beside a number or a list), which has no one type to name (a column of one type
    is named by `data.tokenize`). Read row by row only here, where the data is known to be wrong.
    Known by its name: datasets 4.0, which the supported range allows, has no `Json` to import."""
    if column not in dataset.column_names or type(dataset.features[column]).__name__ != "Json":
        return None
    for index, row in enumerate(dataset.select_columns([column])):
        value = row[column]
        if value is not None and not isinstance(value, str):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else f"{shown[:37]}..."
            return index, f"its '{column}' is {shown} ({json_kind(value)}), not text"
    return None


def json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return "a list" if isinstance(value, list) else "an object"


def text_as_messages(row: dict[str, Any], data_format: str, eos: str) -> list[dict[str, str]] | None:
    """A prompt/answer row as a user turn and an assistant turn, for a tokenizer's chat template;
    None when it has no answer (left out, as in the plain layout)."""
    segments = text_segments(row, data_format, eos)
    if len(segments) < 2:
        return None
    prompt, answer = segments[0][0].removesuffix(SEPARATOR), segments[1][0].removesuffix(eos)
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def check_messages(messages: Any, row: int) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise FinetuneError(f"row {row}: 'messages' must be a non-empty list of {{role, content}}")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise FinetuneError(
                f"row {row}: every message needs a role among {', '.join(ROLES)}, got {message!r:.80}"
            )
        if not isinstance(message.get("content"), str):
            content = message.get("content")
            raise FinetuneError(
                f"row {row}: the {message['role']} message's content must be text, got {content!r:.80}"
            )
    if not any(message["role"] == "assistant" for message in messages):
        raise FinetuneError(f"row {row}: a conversation without an assistant message has nothing to learn")
    return [{"role": message["role"], "content": message["content"]} for message in messages]


def chat_segments(
    messages: list[dict[str, str]], tokenizer: PreTrainedTokenizerBase, template: str, row: int
) -> list[tuple[str, bool]]:
    """The rendered conversation cut at each assistant turn: (text, is an assistant turn)."""

    def render(upto: int, generation_prompt: bool) -> str:
        try:  # transformers renders in Jinja's sandbox, which refuses what a template may not do
            return tokenizer.apply_chat_template(
                messages[:upto],
                chat_template=template,
                tokenize=False,
                add_generation_prompt=generation_prompt,
            )
        except (jinja2.TemplateError, OverflowError) as error:
            raise FinetuneError(
                f"row {row}: the chat template cannot render it ({type(error).__name__}: {first_line(error)})"
            ) from None

    full = render(len(messages), False)
    segments, done = [], 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(index, True), render(index + 1, False)
        if not (full.startswith(through) and through.startswith(before) and len(before) >= done):
            raise FinetuneError(
                f"row {row}: the chat template does not render a conversation as the start of its "
                "continuation, so the assistant turns cannot be found: give another --chat_template"
            )
        segments += [(full[done : len(before)], False), (full[len(before) : len(through)], True)]
        done = len(through)
    segments.append((full[done:], False))
    return [(text, trained) for text, trained in segments if text]


def as_text(value: Any) -> str:
    """A cell as text: CSV columns of numbers arrive as ints, or as floats (3.0) where a cell is empty
    (None or NaN), and an answer "3" must stay "3"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def text_segments(row: dict[str, Any], data_format: str, eos: str) -> list[tuple[str, bool]]:
    """prompt/completion joined as given (TRL's convention: the split point is the dataset's); an
    instruction, its input and a question are followed by SEPARATOR. Every answer ends with EOS; a row
    without an answer has no trained segment (it is left out, with a note, rather than teaching EOS)."""
    if data_format == "prompt_completion":
        prompt, answer = as_text(row["prompt"]), as_text(row["completion"])
    elif data_format == "instruction":
        given = as_text(row.get("input"))
        prompt = as_text(row["instruction"]) + (f"{SEPARATOR}{SEPARATOR}{given}" if given else "") + SEPARATOR
        answer = as_text(row["output"])
    else:
        prompt, answer = as_text(row["question"]) + SEPARATOR, as_text(row["answer"])
    if not answer.strip():
        return [(prompt, False)]
    return [(prompt, False), (answer + eos, True)]


def tokenized_once(
    examples: list[list[tuple[str, bool]]], tokenizer: PreTrainedTokenizerBase
) -> list[tuple[list[int], list[bool]]]:
    """Each example's text tokenized as one string, as `apply_chat_template(tokenize=True)` does at
    inference and TRL does in training, with each token marked trained when it overlaps a trained
    segment's characters (transformers' assistant-token mask, by character offsets).

    Tokenizing the segments one by one would give other tokens where BPE merges across a boundary
    (GPT-2 gives `>` `<` for `><` between ChatML turns that nothing separates). A tokenizer without
    offsets (a slow one) is tokenized segment by segment, as the only way left to know the spans.
    """
    texts = ["".join(text for text, _ in segments) for segments in examples]
    if not tokenizer.is_fast:
        return [segment_by_segment(segments, tokenizer) for segments in examples]
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    results = []
    for segments, ids, offsets in zip(examples, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        spans, position = [], 0
        for text, trained in segments:
            if trained:
                spans.append((position, position + len(text)))
            position += len(text)
        marks = [any(start < end_ and end > start_ for start_, end_ in spans) for start, end in offsets]
        results.append((ids, marks))
    return results


def segment_by_segment(
    segments: list[tuple[str, bool]], tokenizer: PreTrainedTokenizerBase
) -> tuple[list[int], list[bool]]:
    ids: list[int] = []
    marks: list[bool] = []
    for text, trained in segments:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        marks += [trained] * len(piece)
    return ids, marks


def encode(
    dataset: Dataset,
    data_format: str,
    tokenizer: PreTrainedTokenizerBase,
    template: str,
    train_on_prompt: bool,
    name: str,
) -> Dataset:
    """input_ids and labels per example; labels IGNORE_INDEX on the prompt (unless train_on_prompt)
    and on each example's first token, which nothing before it in the example predicts, so that a
    packed block never trains one example's first token from the end of another."""
    eos = tokenizer.eos_token or ""

    def segments_of(row: dict[str, Any], number: int) -> list[tuple[str, bool]]:
        if data_format == "messages":
            messages = row["messages"]
        elif data_format == "sharegpt":
            messages = sharegpt_messages(row["conversations"], number)
        elif template:  # a prompt/answer format through the tokenizer's own chat template
            messages = text_as_messages(row, data_format, eos)
            if messages is None:
                return text_segments(row, data_format, eos)
        else:
            return text_segments(row, data_format, eos)
        return chat_segments(check_messages(messages, number), tokenizer, template, number)

    def encode_batch(batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[list[int]]]:
        rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        examples = [segments_of(row, index + 1) for row, index in zip(rows, indices, strict=True)]
        out: dict[str, list[list[int]]] = {"input_ids": [], "labels": []}
        for ids, trained in tokenized_once(examples, tokenizer):
            pairs = zip(ids, trained, strict=True)
            labels = [token if keep or train_on_prompt else IGNORE_INDEX for token, keep in pairs]
            out["input_ids"].append(ids)
            out["labels"].append([IGNORE_INDEX, *labels[1:]] if labels else [])
        return out

    return dataset.map(
        encode_batch,
        batched=True,
        with_indices=True,
        remove_columns=dataset.column_names,
        desc=f"tokenize {name} ({FORMATS[data_format].description})",
    )
