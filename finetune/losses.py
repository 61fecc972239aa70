"""The causal-LM loss without the full logits tensor: chunked linear + cross-entropy.

A GPT-2 step's logits are tokens x 50,257 values, upcast to fp32 for the loss: 1.6 GB for a micro
batch of 8 x 1024 tokens, read and written several times in forward and backward. Computing the
loss a chunk of tokens at a time, with each chunk's gradients taken in the same pass (the method of
Liger-Kernel's fused linear cross-entropy), keeps one chunk's logits alive instead of all of them.

Hand-written because the library that does this (Liger-Kernel) needs Triton on a GPU and does not
patch GPT-2's model class; this one is plain PyTorch, so it runs and is tested on CPU too. The
result is the model's own loss (transformers' ForCausalLMLoss: labels shifted by one, -100
ignored, summed and divided by `num_items_in_batch` when the Trainer gives it, else averaged),
equal up to floating-point summation order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel
from transformers.integrations import is_deepspeed_zero3_enabled
from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

from finetune.data_formats import IGNORE_INDEX
from finetune.forwards import replace_forward
from finetune.loss_chunks import CHUNK_LOGITS, VOCAB_ALIGNMENT, tokens_per_chunk

if TYPE_CHECKING:
    from finetune.profiles import Strategy

CHUNKED_LOSS_MODEL_TYPES = ("gpt2", "llama")


class LinearCrossEntropy(torch.autograd.Function):
    """Sum over tokens of -log softmax(hidden @ weight.T)[label], gradients computed in forward.

    The weight is padded with zero rows to a multiple of VOCAB_ALIGNMENT (GPT-2's 50,257 is odd,
    which puts the logits and their gradients on slow unaligned matmul kernels); the padded
    columns are cut off before the softmax, so they change nothing.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        vocab = weight.shape[0]
        padded = torch.nn.functional.pad(weight, (0, 0, 0, -vocab % VOCAB_ALIGNMENT))
        chunk = tokens_per_chunk(hidden.device.type, padded.shape[0], hidden.shape[-1])
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(padded.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            piece = hidden[start : start + chunk]
            targets = labels[start : start + chunk]
            loss, grad_logits = _chunk_loss_and_grad(piece @ padded.T, targets, vocab)
            total += loss
            grad_hidden[start : start + chunk] = grad_logits @ padded
            if grad_logits.dtype == grad_weight.dtype:  # fp32: no weight-sized product per chunk
                grad_weight.addmm_(grad_logits.T, piece)
            else:
                grad_weight += (grad_logits.T @ piece).float()
        ctx.save_for_backward(grad_hidden, grad_weight[:vocab].to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_output, grad_weight * grad_output, None


def _chunk_loss_and_grad(
    padded_logits: torch.Tensor, targets: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed loss of one chunk and d(loss)/d(logits), padded columns zero, in the logits' dtype."""
    logits = padded_logits[:, :vocab].float()
    valid = targets != IGNORE_INDEX
    safe_targets = torch.where(valid, targets, 0)
    log_normaliser = torch.logsumexp(logits, dim=-1)
    target_logits = logits.gather(1, safe_targets[:, None]).squeeze(1)
    loss = ((log_normaliser - target_logits) * valid).sum()
    grad = torch.exp(logits - log_normaliser[:, None])
    grad.scatter_add_(1, safe_targets[:, None], -torch.ones_like(grad[:, :1]))
    grad *= valid[:, None]
    grad_padded = torch.zeros_like(padded_logits)
    grad_padded[:, :vocab] = grad
    return loss, grad_padded


def compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype the matmuls run in: autocast's where it is on, else the hidden states' own."""
    device_type = hidden.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype


def next_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Each position's label for the next token, the last ignored: the model's own shift."""
    return torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


@torch.compiler.disable
def causal_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """ForCausalLMLoss from the last hidden states and the output embedding, without full logits.

    `shift_labels`, when given, are the labels already shifted (each position's next token), as
    a sequence split over ranks needs them: its slices are cut after the shift.
    Kept out of torch.compile's graph: compiled by inductor for CUDA this function gave every
    parameter a zero gradient, while the same code compiled for CPU and run eagerly on CUDA trains
    (found with benchmarks/scripts/grad_check.py; docs/speed.md). The model's layers
    before it stay compiled.
    """
    dtype = compute_dtype(hidden)
    shifted = next_tokens(labels) if shift_labels is None else shift_labels
    with torch.autocast(hidden.device.type, enabled=False):
        total = LinearCrossEntropy.apply(
            hidden.reshape(-1, hidden.shape[-1]).to(dtype), weight.to(dtype), shifted.reshape(-1)
        )
    divisor = num_items_in_batch if num_items_in_batch is not None else (shifted != IGNORE_INDEX).sum()
    if torch.is_tensor(divisor):
        divisor = divisor.to(total.device)
    return total / divisor


def loss_sums_per_sample(
    logits: torch.Tensor | tuple[torch.Tensor, ...], labels: torch.Tensor
) -> torch.Tensor:
    """[batch, 2]: each sample's summed next-token loss and its number of predicted tokens.

    A chunk of the batch's positions at a time, at most CHUNK_LOGITS logits (the chunked loss's
    chunk, finetune/loss_chunks.py), so the float32 copy of the logits and the softmax over them are a
    chunk's, not the batch's or a sample's: a long block's were twice its logits again, and a block
    the planner says fits ran out of memory in its evaluation. Called by the evaluation forward
    itself (converters.without_training_logits) and by the Trainer's `preprocess_logits_for_metrics`
    where the forward kept its logits; sums, which a model evaluating through the chunked loss
    (use_chunked_loss) returns too, are passed through.
    """
    if isinstance(logits, tuple):
        logits = logits[0]
    if logits.dim() == 2:
        return logits
    batch, length, vocab = logits.shape
    positions = max(1, CHUNK_LOGITS // (vocab * batch))
    chunks = (logits[:, start : start + positions] for start in range(0, length, positions))
    return summed_by_chunks(chunks, next_tokens(labels))


@torch.no_grad()
def chunked_loss_sums(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[batch, 2]: each sample's summed next-token loss and its number of predicted tokens, as
    loss_sums_per_sample counts them from logits, computed a chunk of tokens at a time without
    gradients, so evaluating a long block holds one chunk of logits and not the block's (its fp32
    copy alone is 4 bytes per token and vocabulary entry)."""
    dtype = compute_dtype(hidden)
    weight = weight.to(dtype)
    positions = max(1, tokens_per_chunk(hidden.device.type, *weight.shape) // hidden.shape[0])
    with torch.autocast(hidden.device.type, enabled=False):
        chunks = (
            hidden[:, start : start + positions].to(dtype) @ weight.T
            for start in range(0, hidden.shape[1], positions)
        )
        return summed_by_chunks(chunks, next_tokens(labels))


def mean_token_loss(sums: torch.Tensor) -> torch.Tensor:
    """The loss over every predicted token of a batch from its per-sample sums ([batch, 2]): what the
    model's own loss returns for it, unweighted by sample."""
    return (sums[:, 0].sum() / sums[:, 1].sum()).to(torch.float32)


def summed_by_chunks(chunks: Iterator[torch.Tensor], shifted: torch.Tensor) -> torch.Tensor:
    """[batch, 2]: the per-sample loss sums and predicted-token counts of logits that come a chunk of
    positions at a time ([batch, positions, vocab], in order), against `shifted`, each position's
    next token (IGNORE_INDEX where none): the one computation both loss sums chunk their logits for.
    Each chunk is made only when the loop reaches it, so one chunk and its fp32 copy are alive."""
    sums = torch.zeros(shifted.shape[0], dtype=torch.float64, device=shifted.device)
    start = 0
    for chunk in chunks:
        logits = chunk.float()
        targets = shifted[:, start : start + logits.shape[1]]
        start += logits.shape[1]
        valid = targets != IGNORE_INDEX
        target_logits = logits.gather(2, torch.where(valid, targets, 0)[..., None]).squeeze(2)
        sums += ((torch.logsumexp(logits, dim=-1) - target_logits) * valid).sum(dim=1).double()
    counts = (shifted != IGNORE_INDEX).sum(dim=1).double()
    return torch.stack([sums, counts], dim=1)


def compile_loss(model: PreTrainedModel) -> None:
    """Compile the model's loss function (transformers' ForCausalLMLoss), which a model compiled
    block by block runs eager.

    Eager, the loss upcasts the logits to fp32 and keeps the log-softmax for backward, whose
    gradients are logits-sized fp32 tensors again: at a vocabulary of 50,257 they were the largest
    allocations alive at a ZeRO-3 step's memory peak, and PyTorch's softmax and copy kernels a
    visible share of a single-profile step (docs/speed.md). Compiled, inductor fuses
    the upcast, the log-softmax and its gradient and saves only the logits. Default mode: CUDA
    graphs would gain nothing for a few large kernels.
    """
    target = model.get_base_model() if hasattr(model, "get_base_model") else model  # under adapters
    target.loss_function = torch.compile(target.loss_function)


class VocabularyAlignedLinear(torch.nn.Linear):
    """A bias-free output layer whose matmul runs at a width padded to VOCAB_ALIGNMENT.

    The weight gets zero rows for the matmul only and the padded logits are cut off again, so the
    parameter, the saved model and the returned logits are the layer's own; the logits are a view
    whose rows keep the aligned stride, and their gradient comes back at the padded width.
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        padding = -self.out_features % VOCAB_ALIGNMENT
        weight = torch.nn.functional.pad(self.weight, (0, 0, 0, padding))
        return torch.nn.functional.linear(hidden, weight)[..., : self.out_features]


def align_output_matmul(model: PreTrainedModel) -> bool:
    """Run the output layer's matmuls at an aligned vocabulary; whether the layer was changed.

    At GPT-2's 50,257 every row of the logits and of their gradient starts unaligned and cuBLAS
    falls back to align-1 kernels, a visible share of an FSDP2 or ZeRO-3 step, eager or compiled
    block by block (profiled; aligned, both ran faster: docs/speed.md).
    A whole-model torch.compile pads on its own. Only bias-free linear output layers whose width is
    not a multiple of VOCAB_ALIGNMENT are changed, by class, so hooks, tied weights and copies keep
    working.
    """
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None or head.out_features % VOCAB_ALIGNMENT == 0:
        return False
    head.__class__ = VocabularyAlignedLinear
    return True


def chunked_loss_problem(model: PreTrainedModel, strategy: Strategy) -> str | None:
    """Why the chunked loss cannot replace this model's own in training, or None when it can.

    The chunked loss reads the output weight outside its module's forward, where ZeRO-3 has it
    sharded (`Strategy.gathers_weights_only_in_forward`). Evaluation, which needs no gradient,
    gathers the weight itself (`model_loss_problem` is its only condition).
    """
    if strategy.gathers_weights_only_in_forward:
        return "ZeRO-3 shards the output layer's weight"
    return model_loss_problem(model)


def model_loss_problem(model: PreTrainedModel) -> str | None:
    """Why this model's loss cannot be computed from its hidden states and output weight, or None."""
    if model.config.model_type not in CHUNKED_LOSS_MODEL_TYPES:
        return f"model type {model.config.model_type} is not one of {', '.join(CHUNKED_LOSS_MODEL_TYPES)}"
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return "its output layer is not a bias-free linear layer"
    return None


def gathered(weight: torch.nn.Parameter) -> contextlib.AbstractContextManager:
    """The whole weight for reading, where ZeRO-3 partitions it (every rank must enter)."""
    if not is_deepspeed_zero3_enabled():
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([weight])


def use_chunked_loss(model: PreTrainedModel, in_training: bool = True) -> PreTrainedModel:
    """Train through causal_lm_loss (unless not `in_training`) and evaluate through
    chunked_loss_sums; calls without labels (generation) and evaluation of a split sequence
    (`shift_labels`) keep the model's forward.

    The model computes its hidden states as usual (so wrappers that hook its modules still see
    them run); only the output layer and the loss are replaced. Training returns no logits;
    evaluation returns each sample's loss sum and token count as its "logits", the [batch, 2]
    that evaluation.loss_sums_per_sample makes of full logits, which it passes through.
    """

    def forward(
        self: PreTrainedModel,
        own_forward: Callable[..., Any],
        input_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        shift_labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        # the model's own loss: in training where not chunked there, in evaluation of a split sequence
        its_own_loss = in_training is False if self.training else shift_labels is not None
        if labels is None or its_own_loss:
            for name, value in (("num_items_in_batch", num_items_in_batch), ("shift_labels", shift_labels)):
                if value is not None:
                    kwargs[name] = value
            return own_forward(self, input_ids=input_ids, labels=labels, **kwargs)
        hidden = self.base_model(input_ids=input_ids, **kwargs).last_hidden_state
        weight = self.get_output_embeddings().weight
        if not self.training:
            with gathered(weight):
                sums = chunked_loss_sums(hidden, weight, labels)
            return CausalLMOutputWithCrossAttentions(loss=mean_token_loss(sums), logits=sums)
        loss = causal_lm_loss(hidden, weight, labels, num_items_in_batch, shift_labels)
        return CausalLMOutputWithCrossAttentions(loss=loss)

    replace_forward(model, forward)  # the Trainer keeps the dataset columns the model's forward names
    return model
