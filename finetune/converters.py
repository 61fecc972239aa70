"""Changes made to the built model before training, as a list (torchtitan's model converters).

Each converter says when a run asks for it, which flag combinations it cannot run with (checked once
the launch is known, before any data or model is loaded: `refuse_incompatible`), and applies itself,
returning the model and the run-summary fields it sets; `convert` applies them in order, in one loop,
as model_setup.py prepares the model. Compilation is not one of them: what is compiled is the compile
plan's (finetune/launched.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel
from transformers.utils import ModelOutput, logging

from finetune.adapters import adapter_flags, add_adapters
from finetune.errors import FinetuneError
from finetune.forwards import replace_forward
from finetune.losses import (
    align_output_matmul,
    chunked_loss_problem,
    loss_sums_per_sample,
    mean_token_loss,
    model_loss_problem,
    use_chunked_loss,
)

logger = logging.get_logger("finetune")

Model = Any  # a PreTrainedModel, or the PeftModel around one


@dataclass(frozen=True)
class Converter:
    name: str
    asked: Callable[[Any, Any], bool]  # (model_args, training_args)
    # (model, model_args, training_args, launch, compute dtype)
    apply: Callable[[Model, Any, Any, Any, str], tuple[Model, dict[str, Any]]]
    refusal: Callable[[Any, Any, Any], str | None] = lambda model_args, training_args, launch: None


def chunked_loss(
    model: Model, model_args: Any, training_args: Any, launch: Any, dtype: str
) -> tuple[Model, dict]:
    """A model whose loss cannot be chunked keeps its own, with a warning (not an error: the flag is
    a memory lever); under ZeRO-3 alone, evaluation is still chunked (it gathers the weight)."""
    problem = chunked_loss_problem(model, launch.strategy)
    evaluation = problem is not None and model_loss_problem(model) is None
    if problem is None or evaluation:
        use_chunked_loss(model, in_training=problem is None)
    if problem is not None and training_args.process_index == 0:
        where = "in training" if evaluation else "off"
        logger.warning(f"finetune: chunked loss {where}: {problem}; the model's own loss is used there")
    return model, {}


def no_padding_check(input_ids: Any, attention_mask: Any) -> None:
    """Stands in for transformers' `warn_if_padding_and_no_attention_mask` (see `without_padding_check`)."""


def without_padding_check(
    model: Model, model_args: Any, training_args: Any, launch: Any, dtype: str
) -> tuple[Model, dict]:
    """Every forward without an attention mask, transformers looks for the pad token at either end of
    the batch to warn about unmasked padding: an index list copied to the device and an `.item()`,
    two host syncs a forward that keep the host from queueing the step ahead of the GPU. finetune's
    collators pass a mask wherever they pad (packed blocks part their examples by position ids), so
    the check could only find the EOS that ends an answer, GPT-2's pad token: it is left out of
    training (a saved model, loaded again, checks as transformers does)."""
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.warn_if_padding_and_no_attention_mask = no_padding_check
    return model, {}


def without_training_logits(
    model: Model, model_args: Any, training_args: Any, launch: Any, dtype: str
) -> tuple[Model, dict]:
    """A training forward that computed its loss returns it without the logits. The Trainer reads only
    the loss there, while accelerate's mixed precision (`convert_outputs_to_fp32`, every profile but
    DeepSpeed's) copies each bf16 output to fp32: a 4-byte copy of every logit, written at the end of
    each forward beside the logits the loss keeps for backward: a share of the step's time (the step
    peaks later, so not of its memory: docs/speed.md).

    An evaluation forward of whole samples runs without its labels and returns the metrics'
    per-sample loss sums in place of the logits (losses.loss_sums_per_sample, the same numbers: bf16
    to fp32 is exact), and as its loss their mean over the predicted tokens, as the model's own loss
    averages them: so evaluation holds no float32 copy of a block's logits, neither accelerate's nor
    the model's own loss's, which eager (uncompiled) upcasts them all and takes their softmax: twice
    the logits again in fp32 (docs/planner.md, "The final evaluation").
    Generation, a split sequence's evaluation (`shift_labels`) and a loss computed outside the model
    (label smoothing: the Trainer takes the labels away) get the logits as before."""
    replace_forward(model, _without_full_logits)
    return model, {}


def _without_full_logits(self: PreTrainedModel, own: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not self.training and kwargs.get("shift_labels") is None and kwargs.get("labels") is not None:
        labels = kwargs.pop("labels")
        outputs = own(self, *args, **kwargs)
        sums = loss_sums_per_sample(outputs.logits, labels)
        outputs["loss"] = mean_token_loss(sums)
        outputs["logits"] = sums
        return outputs
    outputs = own(self, *args, **kwargs)
    if self.training and isinstance(outputs, ModelOutput) and outputs.get("loss") is not None:
        outputs["logits"] = None  # item assignment: ModelOutput keeps a None attribute in its dict
    return outputs


def aligned_output_matmul(
    model: Model, model_args: Any, training_args: Any, launch: Any, dtype: str
) -> tuple[Model, dict]:
    align_output_matmul(model)
    return model, {}


def float8(model: Model, model_args: Any, training_args: Any, launch: Any, dtype: str) -> tuple[Model, dict]:
    from finetune.fp8 import convert_to_float8  # imports torchao, which only --fp8 needs

    return model, {"fp8_layers": convert_to_float8(model)}


def float8_refusal(model_args: Any, training_args: Any, launch: Any) -> str | None:
    if model_args.peft:
        return "--fp8 is for full fine-tuning: with --peft the frozen base gains little from it"
    if launch is not None and not launch.strategy.runs_float8:
        return (
            "--fp8 runs under single, ddp and the FSDP profiles, not DeepSpeed's: its engine is not "
            "tested with torchao's float8 layers"
        )
    return None


def adapters(
    model: Model, model_args: Any, training_args: Any, launch: Any, dtype: str
) -> tuple[Model, dict]:
    return add_adapters(model, adapter_flags(model_args), dtype), {}


CONVERTERS = (
    Converter("padding_check", lambda model_args, training_args: True, without_padding_check),
    # before the chunked loss, whose forward wraps it: the chunked evaluation passes no labels on
    Converter("training_logits", lambda model_args, training_args: True, without_training_logits),
    Converter("chunked_loss", lambda model_args, training_args: training_args.chunked_loss, chunked_loss),
    Converter("align_output_matmul", lambda model_args, training_args: training_args.align_output_matmul,
              aligned_output_matmul),
    Converter("fp8", lambda model_args, training_args: training_args.fp8, float8, float8_refusal),
    Converter("peft", lambda model_args, training_args: bool(model_args.peft), adapters),
)  # fmt: skip


def refuse_incompatible(model_args: Any, training_args: Any, launch: Any = None) -> None:
    """One line for the first converter the run asks for that cannot run with its other flags or (once
    known) its launch."""
    for converter in CONVERTERS:
        if converter.asked(model_args, training_args):
            problem = converter.refusal(model_args, training_args, launch)
            if problem:
                raise FinetuneError(problem)


def convert(
    model: Model, model_args: Any, training_args: Any, launch: Any, dtype: str
) -> tuple[Model, dict[str, Any]]:
    """Every converter the run asks for, in order; the summary fields they set (fp8_layers: None when
    not asked)."""
    fields: dict[str, Any] = {"fp8_layers": None}
    for converter in CONVERTERS:
        if converter.asked(model_args, training_args):
            model, set_fields = converter.apply(model, model_args, training_args, launch, dtype)
            fields.update(set_fields)
    return model, fields
