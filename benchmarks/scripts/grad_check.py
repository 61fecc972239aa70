"""Which layer loses the gradients of a compiled GPT-2 step on CUDA: bare loop or accelerate (issue 6).

The compiled runs under the Trainer logged gradient norm 0 on an H200 and did not on CPU. Each
variant here takes two training steps of a 2-layer GPT-2 (gpt2's widths) from the same seed and
prints the loss, whether it carries a graph, and the gradient norm after the first backward, so
one call tells whether torch.compile, the chunked loss or accelerate's prepare (autocast wrapper
around a compiled module) is where the gradients go.
usage: python benchmarks/scripts/grad_check.py MODEL_FOLDER OUT_JSON
"""

import json
import sys

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import TorchDynamoPlugin
from transformers import AutoConfig, AutoModelForCausalLM

from finetune.losses import use_chunked_loss

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: to try the script itself


def build(model_dir: str, chunked: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir, n_layer=2)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
    model.loss_type = "ForCausalLM"
    return use_chunked_loss(model) if chunked else model


def grad_norm(model: torch.nn.Module) -> float:
    grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(grads).norm().item() if grads else 0.0


def check(model_dir: str, through_accelerate: bool, compiled: bool, chunked: bool) -> dict:
    model = build(model_dir, chunked)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    inputs = torch.randint(0, model.config.vocab_size, (4, 1024), device=DEVICE)
    if through_accelerate:
        plugin = TorchDynamoPlugin(backend="inductor" if compiled else "no")
        accelerator = Accelerator(mixed_precision="bf16", dynamo_plugin=plugin, cpu=DEVICE == "cpu")
        step_model, optimizer = accelerator.prepare(model.to(DEVICE), optimizer)
        backward = accelerator.backward
    else:
        model.to(DEVICE)
        step_model = torch.compile(model) if compiled else model
        backward = torch.Tensor.backward
    row = {"accelerate": through_accelerate, "compile": compiled, "chunked": chunked, "steps": []}
    for _ in range(2):
        if through_accelerate:
            loss = step_model(input_ids=inputs, labels=inputs, num_items_in_batch=torch.tensor(4 * 1023)).loss
        else:
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                loss = step_model(input_ids=inputs, labels=inputs).loss
        graph = type(loss.grad_fn).__name__ if loss.grad_fn is not None else None
        backward(loss)
        row["steps"].append({"loss": loss.item(), "grad_fn": graph, "grad_norm": grad_norm(model)})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(row, flush=True)
    return row


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    rows = []
    for through_accelerate in (False, True):
        for compiled in (False, True):
            for chunked in (False, True):
                rows.append(check(model_dir, through_accelerate, compiled, chunked))
                torch._dynamo.reset()
                AcceleratorState._reset_state(True)
    with open(out, "w") as file:
        json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
