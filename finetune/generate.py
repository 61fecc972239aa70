"""Text from a saved model: `finetune generate MODEL --prompt ...`, and `--generation_prompt` in a run."""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2
import torch
from accelerate import PartialState
from tqdm import tqdm
from transformers import (
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    set_seed,
)

from finetune.arguments import check_seed
from finetune.checkpoint import load_weights_only
from finetune.errors import FinetuneError, first_line
from finetune.instruction import end_of_turn_ids
from finetune.local_data import not_text
from finetune.models import SavedModel, context_key, context_length


def check_stop_texts(stop: tuple[str, ...]) -> None:
    """An empty --stop would end every completion before its first token (a ValueError traceback in
    the text cut, after the model was loaded and had generated)."""
    if "" in stop:
        raise FinetuneError(
            "--stop '' is empty: give the text that ends a completion, e.g. --stop 'Question:'"
        )


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 50
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    greedy: bool = False
    seed: int = 42
    stop: tuple[str, ...] = ()  # --stop: text that ends a completion, beside the end-of-turn tokens

    def __post_init__(self) -> None:
        """transformers takes some of these silently (max_new_tokens -5 generates nothing) and fails
        on others only after the model is loaded."""
        if self.max_new_tokens < 1:
            raise FinetuneError(f"--max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not 0 < self.temperature < math.inf:  # inf samples every token alike: noise, not the model
            raise FinetuneError(f"--temperature must be a positive number, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise FinetuneError(f"--top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise FinetuneError(f"--top_k must be 0 (no limit) or more, got {self.top_k}")
        check_seed(self.seed)
        check_stop_texts(self.stop)

    def generation_config(self, pad_token_id: int, stop_ids: list[int]) -> GenerationConfig:
        common = {
            "max_new_tokens": self.max_new_tokens,
            "pad_token_id": pad_token_id,
            "eos_token_id": stop_ids,
            "stop_strings": list(self.stop) or None,
        }
        if self.greedy:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, **common
        )


def completion_text(
    tokenizer: PreTrainedTokenizerBase, generated: list[int], stop_ids: list[int], stop: tuple[str, ...]
) -> str:
    """The completion up to its first end-of-turn token or --stop text, special tokens dropped: a batch
    row that ended goes on receiving tokens (padding) while the others generate."""
    cut = next((index for index, token in enumerate(generated) if token in stop_ids), len(generated))
    text = tokenizer.decode(generated[:cut], skip_special_tokens=True)
    for marker in stop:
        text = text.split(marker, 1)[0]
    return text


def read_prompts(prompts: list[str], prompts_file: str | None) -> list[str]:
    """Prompts given on the command line, then one per non-empty line of the file."""
    found = list(prompts)
    if prompts_file:
        try:
            data = Path(prompts_file).read_bytes()
        except OSError as error:
            raise FinetuneError(f"--prompts_file {prompts_file}: {error.strerror}") from None
        problem = not_text(Path(prompts_file), data)
        if problem:
            raise FinetuneError(f"--prompts_file {problem}")
        in_file = [line for line in data.decode("utf-8").splitlines() if line.strip()]
        if not in_file:
            raise FinetuneError(f"--prompts_file {prompts_file} holds no prompt: every line is empty")
        found += in_file
    if not found:
        raise FinetuneError("give at least one --prompt or a --prompts_file")
    return found


@dataclass(frozen=True)
class Chat:
    """`finetune generate --chat`: each prompt is a user's message (after an optional system one)."""

    system: str | None = None

    def render(self, tokenizer: PreTrainedTokenizerBase, prompt: str, model_path: str) -> str:
        """The conversation so far with the assistant's turn opened, by the chat template saved with
        the model: a model trained on chat data answers in the format it was trained on."""
        if tokenizer.chat_template is None:
            raise FinetuneError(
                f"--chat: {model_path} has no chat template (a model trained on chat data saves one)"
            )
        system = [{"role": "system", "content": self.system}] if self.system else []
        messages = [*system, {"role": "user", "content": prompt}]
        try:  # transformers renders in Jinja's sandbox, which refuses what a template may not do
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except jinja2.TemplateError as error:
            raise FinetuneError(
                f"--chat: the chat template of {model_path} cannot be rendered "
                f"({type(error).__name__}: {first_line(error)})"
            ) from None


def start_of_text(tokenizer: PreTrainedTokenizerBase) -> int:
    """What an empty prompt starts from: the beginning-of-text token, as transformers' `generate`
    starts without a prompt (GPT-2's `<|endoftext|>` is its BOS and EOS both)."""
    token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if token is None:
        raise FinetuneError("an empty prompt starts from a BOS token, and the model's tokenizer has none")
    return token


@torch.no_grad()
def generate(model_path: str, prompts: list[str], sampling: Sampling, chat: Chat | None = None) -> list[str]:
    """One completion per prompt (the generated text only), reproducible for a given seed.

    The model folder's pickles are read weights-only and its custom code never runs (no
    --trust_remote_code here): a downloaded or shared folder is data, not a program. A chat
    template renders its own special tokens (a BOS among them), so the tokenizer adds none.
    """
    load_weights_only()
    saved = SavedModel.at(model_path)
    tokenizer = saved.tokenizer()
    config = saved.config()
    encoded = []
    for prompt in prompts:
        text = prompt if chat is None else chat.render(tokenizer, prompt, model_path)
        ids = tokenizer(text, add_special_tokens=chat is None)["input_ids"]
        encoded.append(ids or [start_of_text(tokenizer)])
    rooms = [room_for(config, len(prompt_ids), sampling.max_new_tokens) for prompt_ids in encoded]
    model = saved.model(config).eval()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    stop_ids = end_of_turn_ids(tokenizer)
    generation_config = sampling.generation_config(tokenizer.pad_token_id, stop_ids)
    completions = []
    for prompt_ids, room in zip(encoded, rooms, strict=True):
        set_seed(sampling.seed)
        inputs = torch.tensor([prompt_ids], device=device)
        output = model.generate(
            input_ids=inputs,
            attention_mask=torch.ones_like(inputs),
            generation_config=replace_max_new_tokens(generation_config, room),
            tokenizer=tokenizer,
        )
        generated = output[0, len(prompt_ids) :].tolist()
        completions.append(completion_text(tokenizer, generated, stop_ids, sampling.stop))
    return completions


def replace_max_new_tokens(config: GenerationConfig, max_new_tokens: int) -> GenerationConfig:
    """A copy with another length: transformers deprecates passing it beside a generation config."""
    if config.max_new_tokens == max_new_tokens:
        return config
    shortened = copy.deepcopy(config)
    shortened.max_new_tokens = max_new_tokens
    return shortened


def room_for(config: PretrainedConfig, prompt_tokens: int, max_new_tokens: int) -> int:
    """New tokens a prompt leaves room for in the model's context, at most --max_new_tokens: past
    GPT-2's learned positions (n_positions) generation fails with an index error deep in its
    embedding. A prompt that fills the context is refused; a cut is said once on stderr."""
    context = context_length(config)
    if context is None or prompt_tokens + max_new_tokens <= context:
        return max_new_tokens
    if prompt_tokens >= context:
        raise FinetuneError(
            f"a prompt of {prompt_tokens} tokens fills the model's context of {context} tokens (its "
            f"config's {context_key(config)}): shorten the prompt"
        )
    room = context - prompt_tokens
    print(
        f"finetune: a prompt of {prompt_tokens} tokens leaves room for {room} new tokens in the model's "
        f"context of {context} (--max_new_tokens {max_new_tokens})",
        file=sys.stderr,
    )
    return room


@torch.no_grad()
def complete_greedily(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    stop: tuple[str, ...] = (),
) -> list[str]:
    """The greedy completion of each tokenized prompt (the generated text only), up to EOS, which
    training ends every answer with, or the chat template's end of turn (`end_of_turn_ids`).

    Prompts of similar length are batched together and left-padded: a decoder-only model continues
    from the last position of each row, so the padding must come before the prompt (transformers
    derives the position ids from the attention mask).
    """
    device = next(model.parameters()).device
    stop_ids = end_of_turn_ids(tokenizer)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=stop_ids,
        stop_strings=list(stop) or None,
    )
    order = sorted(range(len(prompts)), key=lambda index: len(prompts[index]))
    completions = [""] * len(prompts)
    shown = PartialState().is_main_process  # each rank generates its share; one bar
    with tqdm(total=len(prompts), desc="generate", unit="example", disable=not shown) as progress:
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            inputs = tokenizer.pad(
                {"input_ids": [prompts[index] for index in chosen]}, padding_side="left", return_tensors="pt"
            ).to(device)
            output = model.generate(**inputs, generation_config=config, tokenizer=tokenizer)
            for index, generated in zip(chosen, output[:, inputs["input_ids"].shape[1] :], strict=True):
                completions[index] = completion_text(tokenizer, generated.tolist(), stop_ids, stop)
            progress.update(len(chosen))
    return completions
