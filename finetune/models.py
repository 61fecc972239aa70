"""Model and tokenizer loading: names to folders, config overrides, random init only when asked."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights
from transformers.integrations import deepspeed_config, is_deepspeed_zero3_enabled
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from finetune.errors import FinetuneError, first_line
from finetune.instruction import check_chat_template
from finetune.resolve import describe_tried, resolve
from finetune.run_flags import ModelArguments

GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")
MODEL_ALIASES = {
    "gpt2-small": "gpt2",
    **{f"openai-community/{size}": size for size in GPT2_NAMES if size != "distilgpt2"},
    "distilbert/distilgpt2": "distilgpt2",
}
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# From transformers 5.25 on, `from_pretrained` swaps layers for kernels it fetches from the Hub unless
# told not to: code from the network, a failure offline, and a model other than the one the planner
# counts and the benchmarks measured. Every load of weights here keeps the model's own layers.
OWN_LAYERS = {"use_kernels": False}
MAX_DEFAULT_BLOCK_SIZE = 1024


def resolve_model(name: str, what: str = "model") -> str:
    """A local folder if there is one (path or $FINETUNE_DATA_DIR/<name>), else the Hub id; `what` names
    the flag's thing (model or tokenizer) in the error."""
    canonical = MODEL_ALIASES.get(name, name)
    found = resolve(name, local_names=(canonical,), hub_id=canonical)
    if found.local_path is not None:
        return str(found.local_path)
    if found.hub_id is not None:
        return found.hub_id
    raise FinetuneError(f"{what} '{name}' not found; {describe_tried(found)}")


def load_config(args: ModelArguments, location: str) -> PretrainedConfig:
    try:
        config = AutoConfig.from_pretrained(location, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        raise FinetuneError(
            f"cannot load the config of model '{args.model}' from {location}: {first_line(error)}"
        ) from None
    if args.config_overrides:
        apply_config_overrides(config, args.config_overrides)
    return config


# The sizes a model is built from, by transformers' common names (a config's attribute_map gives its
# own: GPT-2's n_layer is num_hidden_layers). No model config checks them: `n_layer=0` or `n_layer=-1`
# builds, trains and saves a model without a single block.
SIZES = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


def apply_config_overrides(config: PretrainedConfig, overrides: str) -> None:
    """run_clm.py's `--config_overrides "n_layer=2,n_embd=64"`, with a size below 1 refused."""
    try:
        config.update_from_string(overrides)
    except ValueError as error:
        raise FinetuneError(f"--config_overrides '{overrides}': {first_line(error)}") from None
    for size in SIZES:
        value = getattr(config, size, None)
        if isinstance(value, int) and value < 1:
            name = config.attribute_map.get(size, size)
            raise FinetuneError(f"--config_overrides '{overrides}': {name} must be at least 1, got {value}")


def load_tokenizer(args: ModelArguments, location: str) -> PreTrainedTokenizerBase:
    source = resolve_model(args.tokenizer, "tokenizer") if args.tokenizer else location
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=args.trust_remote_code)
    except Exception as error:  # the tokenizers library raises a bare Exception for a damaged file
        empty = sorted(
            path.name for path in Path(source).glob("*") if path.is_file() and not path.stat().st_size
        )
        which = f" ({', '.join(empty)} empty)" if empty else ""
        raise FinetuneError(f"cannot load a tokenizer from {source}{which}: {first_line(error)}") from None
    if len(tokenizer) < 2:  # transformers builds an empty tokenizer from a folder without its files
        raise FinetuneError(
            f"no tokenizer in {source}: its files (tokenizer.json, or vocab.json and merges.txt, ...) are "
            "missing: copy them into it (finetune run also takes --tokenizer NAME)"
        )
    if tokenizer.chat_template:  # a folder's template is data, checked before anything renders it
        check_chat_template(tokenizer.chat_template, f"the chat template of {source}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def vocabulary_growth(
    args: ModelArguments, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase
) -> int:
    """How many tokens the tokenizer has beyond the model's embedding rows (its added special tokens,
    ChatML's <|im_start|> and <|im_end|> say), checked before any data is built: a token id past the
    embedding is an IndexError deep in the first forward. Adapters cannot learn the new rows."""
    grown = len(tokenizer) - config.vocab_size
    if grown > 0 and args.peft:
        raise FinetuneError(
            f"the tokenizer has {len(tokenizer)} tokens, the model's embedding {config.vocab_size} rows: "
            "--peft adapters cannot learn the new tokens' embeddings; train without --peft, or use a "
            "tokenizer without added tokens"
        )
    return max(grown, 0)


def resize_to_tokenizer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    """Embedding and output rows for every token of the tokenizer, tied or not, the new rows drawn around
    the mean of the others (transformers' mean_resizing, which gathers ZeRO-3's partitions itself).
    The saved config records the new size, so `from_pretrained` gets the same shapes. Rows now."""
    model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return model.config.vocab_size


def has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def check_attention_implementation(args: ModelArguments, config: PretrainedConfig) -> PreTrainedModel | None:
    """Refuse an attention kernel the model class cannot use before any data is built; returns the
    model built on the meta device for further checks (None for remote code).

    transformers checks it only while building the model; the class is built here on the meta device
    (a fraction of a second, no memory, even for billions of parameters) and directly, not through
    `from_config`, which under ZeRO-3 would partition it. A model of remote code is checked when built.
    """
    try:
        return on_meta_device(config, args.attn_implementation)
    except (ValueError, ImportError) as error:
        reason = first_line(error).split(". ")[0].rstrip(".")
        raise FinetuneError(f"--attn_implementation {args.attn_implementation}: {reason}") from None


def on_meta_device(config: PretrainedConfig, attn_implementation: str | None) -> PreTrainedModel | None:
    """The model's class built on the meta device: its modules without memory, to check a run
    against before any data is built; None for a model of remote code (checked when built)."""
    mapping = AutoModelForCausalLM._model_mapping
    if type(config) not in mapping:
        return None
    asked = copy.deepcopy(config)
    asked._attn_implementation = attn_implementation
    with torch.device("meta"), no_init_weights():
        return mapping[type(config)](asked)


def build_model(args: ModelArguments, config: PretrainedConfig, location: str) -> PreTrainedModel:
    """Random init with --from_scratch; otherwise real weights or a clear error, never a silent random init.

    Weights are kept in fp32: mixed precision is applied by autocast/DeepSpeed, which need fp32 masters.
    """
    common = {"attn_implementation": args.attn_implementation, "trust_remote_code": args.trust_remote_code}
    if args.from_scratch:
        # Building may draw (ZeRO-3's partitioning does, on the accelerator); the weights are drawn from
        # the random state the build started from, on every profile.
        accelerators = [torch.accelerator.current_device_index()] if torch.accelerator.is_available() else []
        with torch.random.fork_rng(devices=accelerators), no_init_weights():
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **common)
        if weights_come_from_rank_zero():
            model.tie_weights()  # what initialize_weights does besides drawing
        else:
            initialize_weights(model)
        return name_causal_lm_loss(model)
    folder = Path(location)
    if folder.is_dir() and not has_weights(folder):
        raise FinetuneError(
            f"model '{args.model}' at {folder} has a config but no weights "
            f"(none of {', '.join(WEIGHT_FILES)}); pass --from_scratch to train it from random initialisation"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location, config=config, dtype=torch.float32, **common, **OWN_LAYERS
        )
    except SafetensorError as error:  # a truncated or damaged weights file
        damaged = next((path for path in sorted(folder.glob("*.safetensors")) if unreadable(path)), folder)
        raise FinetuneError(
            f"cannot load weights of model '{args.model}': {damaged}: {first_line(error)}"
        ) from None
    except OSError as error:
        raise FinetuneError(
            f"cannot load weights of model '{args.model}' from {location}: {first_line(error)}"
        ) from None
    return name_causal_lm_loss(model)


def weights_come_from_rank_zero() -> bool:
    """Whether this process's weights will be rank 0's, broadcast: FSDP2 with
    `fsdp_cpu_ram_efficient_loading` (the FSDP profiles), where accelerate shards the model on the meta
    device and fills every rank's shards from rank 0's full weights. The other ranks then leave their
    weights undrawn (allocated, never written: pages the host does not fill): drawn on every rank, a
    large from-scratch model filled every rank's host memory and took minutes to its first step
    (docs/planner.md). Not the meta device: accelerate maps the optimizer's parameters to the shards
    by their storage, which meta tensors do not have."""
    from transformers.integrations import is_fsdp_enabled

    return is_fsdp_enabled() and torch.distributed.get_rank() != 0


ADAPTER_CONFIG = "adapter_config.json"  # peft's: a folder of adapters, not of a model


@dataclass(frozen=True)
class SavedModel:
    """A folder to evaluate or generate from: a model, or a `--peft` run's adapters on their base.

    A `--peft` run's output_dir holds peft's adapter folder and the run's tokenizer, not a model: its
    `adapter_config.json` names the base the adapters were trained on, and the model is that base with
    the adapters loaded and merged by peft's own `PeftModel.from_pretrained` and `merge_and_unload`.
    """

    model_path: str  # as given
    location: str  # the folder (or Hub id): the tokenizer, and the model unless it holds adapters
    base: str | None = None  # the adapters' base model, as their config names it

    @classmethod
    def at(cls, model_path: str) -> SavedModel:
        location = resolve_model(model_path)
        adapter_file = Path(location) / ADAPTER_CONFIG
        if not adapter_file.is_file() or (Path(location) / "config.json").is_file():
            return cls(model_path, location)
        try:
            base = json.loads(adapter_file.read_text(encoding="utf-8")).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError) as error:
            raise FinetuneError(f"{adapter_file}: cannot read it: {first_line(error)}") from None
        if not base:
            raise FinetuneError(f"{adapter_file} names no base model (base_model_name_or_path)")
        return cls(model_path, location, base)

    def _base_arguments(self) -> tuple[ModelArguments, str]:
        if self.base is None:
            return ModelArguments(model=self.model_path), self.location
        try:
            return ModelArguments(model=self.base), resolve_model(self.base)
        except FinetuneError as error:
            raise FinetuneError(
                f"{self.model_path} holds adapters trained on '{self.base}', not found here ({error})"
            ) from None

    def config(self) -> PretrainedConfig:
        return load_config(*self._base_arguments())

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return load_tokenizer(ModelArguments(model=self.model_path), self.location)

    def model(self, config: PretrainedConfig) -> PreTrainedModel:
        arguments, location = self._base_arguments()
        model = build_model(arguments, config, location)
        if self.base is None:
            return model
        from peft import PeftModel

        vocabulary = len(self.tokenizer())
        if vocabulary > model.get_input_embeddings().num_embeddings:  # the run added tokens
            model.resize_token_embeddings(vocabulary)
        try:
            return PeftModel.from_pretrained(model, self.location).merge_and_unload()
        except (OSError, ValueError, RuntimeError) as error:
            raise FinetuneError(
                f"cannot load the adapters in {self.location} onto '{self.base}': {first_line(error)}"
            ) from None


def unreadable(weights: Path) -> bool:
    try:
        with safe_open(weights, "pt") as opened:
            opened.keys()
    except (SafetensorError, OSError):
        return True
    return False


def initialize_weights(model: PreTrainedModel) -> None:
    """Run the model's own weight init module by module, children first (transformers' order), from the
    random state the model was built from: every profile starts from the same weights for one seed.

    Under ZeRO-3 the weights are partitioned as they are created, and transformers 5.17 initializes
    them module by module with only that module's own parameters gathered (`initialize_weights_zero3`,
    huggingface/transformers#44236): an `_init_weights` that sets a child's weight writes into an
    empty shard (GPT-2's residual projections kept 0.02 instead of 0.02/sqrt(2 x layers)), and its
    random draws follow another order, so ZeRO-3 started from other weights than every other
    profile. Here each module is gathered with its direct children (the peak stays at one block's
    weights), rank 0 draws and DeepSpeed broadcasts on leaving the gather; without ZeRO-3 each
    module draws its own, on the accelerator where there is one (`drawn_on_the_accelerator`). The
    model is built with transformers' init switched off, so each weight is drawn once.
    """
    zero3 = is_deepspeed_zero3_enabled()
    if zero3:
        import deepspeed

    def initialize(module: torch.nn.Module, owner: PreTrainedModel) -> None:
        for child in module.children():
            initialize(child, child if isinstance(child, PreTrainedModel) else owner)
        if not zero3:
            with drawn_on_the_accelerator(module):
                owner._init_weights(module)
            return
        weights = [*module.parameters(recurse=False)]
        weights += [p for child in module.children() for p in child.parameters(recurse=False)]
        with deepspeed.zero.GatheredParameters(weights, modifier_rank=0):
            if deepspeed.comm.get_rank() == 0:
                owner._init_weights(module)

    model.tie_weights()  # a tied weight is drawn where its last user draws it, as transformers does
    with torch.no_grad():
        initialize(model, model)
    model.tie_weights()


@contextmanager
def drawn_on_the_accelerator(module: torch.nn.Module) -> Iterator[None]:
    """Let a module (and its direct children, which GPT-2's init also sets) draw its weights on the
    accelerator, then put them back where the model was built.

    Drawing a billion normal samples takes a CPU core tens of seconds, the GPU milliseconds: most of
    a large model's build time otherwise (gpt2-xl's start-up, docs/speed.md). ZeRO-3
    draws its gathered weights on the accelerator too. One module at a time is on the accelerator.
    Without an accelerator nothing moves.
    """
    if not torch.accelerator.is_available():
        yield
        return
    device = torch.accelerator.current_accelerator(check_available=True)
    device = torch.device(device.type, torch.accelerator.current_device_index())
    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    tensors += [
        t
        for child in module.children()
        for t in (*child.parameters(recurse=False), *child.buffers(recurse=False))
    ]
    homes = {id(t): (t, t.data) for t in tensors if t.device != device}
    for tensor, home in homes.values():
        tensor.data = home.to(device)
    try:
        yield
    finally:
        for tensor, home in homes.values():
            home.copy_(tensor.data)
            tensor.data = home


def gather_zero3_by_block(model: PreTrainedModel, adapters: bool, deepcompile: bool) -> list[str]:
    """Under ZeRO-3, make each transformer block one DeepSpeed leaf module; the classes found so.

    The blocks are the model's `_no_split_modules`, the classes FSDP2's transformer-based wrap
    shards by. As a leaf, a block's parameters are gathered, and its gradients reduced, once per
    block instead of per Linear and norm: ZeRO-3's per-module Python hooks were what a one-process
    ZeRO-3 step waited on, and a 1B Llama trained faster per block with the same losses and peak
    (docs/speed.md). A DeepSpeed JSON that names
    its own `zero_optimization.leaf_module` is followed as written (an empty list of classes: hooks
    per module, DeepSpeed's default).

    With adapters on a frozen base (`adapters`) the embeddings' output is made to require grad:
    DeepSpeed reduces a leaf block's gradients in a full backward hook, which torch fires as soon as
    the output's gradient arrives when no input requires grad, so the first block's adapters were
    reduced before their gradients existed (DeepSpeed 0.19.8: a zero-size gradient, then a shape error).
    Not under DeepCompile (`deepcompile`, the strategy's), which removes the module hooks and gathers
    inside its compiled graph.
    """
    if (
        deepcompile
        or not is_deepspeed_zero3_enabled()
        or "leaf_module" in deepspeed_config().get("zero_optimization", {})
    ):
        return []
    from deepspeed.utils import set_z3_leaf_modules

    blocks = list(model._no_split_modules or [])
    if not blocks:
        return []
    found = sorted(
        {type(module).__name__ for module in set_z3_leaf_modules(model, blocks, raise_if_not_found=False)}
    )
    if found and adapters:
        model.enable_input_require_grads()
    return found


def blocks_of(model: torch.nn.Module, block_classes: list[str]) -> list[torch.nn.Module]:
    """The model's modules of the named block classes (what `gather_zero3_by_block` found)."""
    return [module for module in model.modules() if type(module).__name__ in block_classes]


def compile_zero3_blocks(model: PreTrainedModel, block_classes: list[str], mode: str | None) -> int:
    """Compile the forward of each ZeRO-3 leaf block, DeepSpeed's hooks around it left eager; how many.

    accelerate's compilation of a DeepSpeed model compiles the engine, or each block's `__call__`
    (regional), hooks included: dynamo then traced into DeepSpeed's parameter fetch, broke the graph
    there and recompiled as the hooks switched grad mode, and ZeRO-3 ran slower compiled than eager
    (docs/speed.md). A leaf block's parameters are all gathered by
    its own pre-forward hook before its forward runs and nothing inside it is hooked, so its forward
    is one graph, shared by every block of the class: faster than eager on a 1B Llama and on gpt2-xl,
    with less memory (docs/speed.md).
    """
    blocks = blocks_of(model, block_classes)
    for block in blocks:
        block.forward = torch.compile(block.forward, mode=mode)
    return len(blocks)


ZERO3_LINEAR_WARNING = (
    "finetune: the DeepSpeed JSON leaves zero_optimization.memory_efficient_linear on: DeepSpeed replaced "
    "torch.nn.functional.linear and each compiled block recompiles on its weights' ids (set it false, as "
    "the shipped stage-3 JSONs do)"
)


def zero3_linear_warning(model: PreTrainedModel, block_classes: list[str]) -> str | None:
    """The warning line for compiled ZeRO-3 blocks that call DeepSpeed's `zero3_linear_wrap`, which
    DeepSpeed's `zero.Init` swaps in for `torch.nn.functional.linear` for the whole process unless the
    JSON's `zero_optimization.memory_efficient_linear` is false. The wrap is an autograd function that
    reads each weight's `ds_id`, so a compiled block guards on it: every block of an `nn.Linear` model
    (a Llama; GPT-2's LoRA adapters, not its Conv1D layers) recompiled until dynamo's limit and the
    rest ran eager, the wrap also keeping each layer's input itself (a 1B Llama under zero3 ran faster
    and in less memory without it: docs/speed.md). None where it does not apply."""
    try:
        from deepspeed.runtime.zero.linear import zero3_linear_wrap
    except ImportError:
        return None
    if torch.nn.functional.linear is not zero3_linear_wrap:
        return None
    blocks = blocks_of(model, block_classes)
    if not any(isinstance(layer, torch.nn.Linear) for block in blocks for layer in block.modules()):
        return None
    return ZERO3_LINEAR_WARNING


def name_causal_lm_loss(model: PreTrainedModel) -> PreTrainedModel:
    """Give models whose class name hides it (GPT2LMHeadModel) the loss type they already use.

    Such a model falls back to ForCausalLMLoss anyway, but with `loss_type` unset the Trainer counts
    every label as a prediction target, not labels[1:], and divides the summed loss by one token too
    many per sample: the loss comes out low by a factor (block_size - 1) / block_size.
    """
    if model.loss_type is None:
        model.loss_type = "ForCausalLM"
    return model


CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "seq_length")


def context_key(config: PretrainedConfig) -> str | None:
    """The config entry that bounds the model's positions (GPT-2's learned ones: n_positions)."""
    for key in CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return key
    return None


def context_length(config: PretrainedConfig) -> int | None:
    key = context_key(config)
    return None if key is None else getattr(config, key)


def choose_block_size(requested: int | None, config: PretrainedConfig) -> int:
    """The block a run trains at: at most the model's context, also under --sequence_parallel
    (which splits a block's tokens over ranks, not its positions)."""
    context = context_length(config)
    if requested is None:
        return min(context or MAX_DEFAULT_BLOCK_SIZE, MAX_DEFAULT_BLOCK_SIZE)
    if context is not None and requested > context:
        raise FinetuneError(
            f"--block_size {requested} is larger than the model's context of {context} tokens (its "
            f"config's {context_key(config)})"
        )
    return requested


def tied_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names under which a parameter already named earlier appears again (GPT-2's lm_head.weight is
    its token embedding): a checkpoint's safetensors store such a tensor once."""
    seen: set[int] = set()
    tied = set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:
            tied.add(name)
        seen.add(id(parameter))
    return tied


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once), as published model sizes are.

    Under ZeRO-3 a parameter's local tensor is an empty shard; `ds_numel` holds its full size.
    """
    unique = {id(p): p for p in model.parameters()}.values()
    return sum(getattr(p, "ds_numel", p.numel()) for p in unique)
