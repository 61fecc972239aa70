"""Where a GPT-2 training step's time goes, lever by lever, in one process on one GPU (issue 6).

Times the output layer's three matmuls at GPT-2's odd vocabulary and padded to a multiple of 64,
then whole training steps (bf16 autocast, fp32 weights, fused AdamW, dropout on, as run.py trains)
with and without torch.compile and the chunked loss, and a torch.profiler table of the compiled
variants. Every variant also reports its first and last loss and first gradient norm: a fast step
that does not learn is a bug, not a result.
usage: python benchmarks/scripts/levers.py MODEL_FOLDER OUT_DIR
"""

import json
import statistics
import sys
import time

import torch
import triton.testing
from transformers import AutoConfig, AutoModelForCausalLM

from finetune.losses import use_chunked_loss


def output_layer_row(vocab: int, tokens: int = 8192, hidden: int = 1024) -> dict:
    h = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: (h @ w.T, g @ w, g.T @ h), return_mode="median")
    return {
        "what": f"output layer fwd+bwd matmuls, vocab {vocab}",
        "ms": ms,
        "tflops": 6 * tokens * hidden * vocab / ms / 1e9,
    }


def training_row(model_dir: str, out: str, compiled: bool, chunked: bool, batch: int, profile: bool) -> dict:
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").cuda().train()
    model.loss_type = "ForCausalLM"
    if chunked:
        use_chunked_loss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    step_model = torch.compile(model) if compiled else model
    inputs = torch.randint(0, config.vocab_size, (batch, 1024), device="cuda")
    torch.cuda.reset_peak_memory_stats()

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(input_ids=inputs, labels=inputs).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach(), norm

    first_loss, first_norm = (value.item() for value in step())
    times = []
    for index in range(30):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss, _ = step()
        torch.cuda.synchronize()
        if index >= 7:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    row = {
        "what": f"step compile={compiled} chunked_loss={chunked} batch={batch}",
        "ms": 1000 * median,
        "spread_ms": 1000 * (max(times) - min(times)),
        "tokens_per_second": batch * 1024 / median,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "first_loss": first_loss,
        "first_grad_norm": first_norm,
        "last_loss": loss.item(),
    }
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
        with open(f"{out}/profile_{compiled}_{chunked}_{batch}.txt", "w") as file:
            file.write(table)
    return row


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    rows = [output_layer_row(vocab) for vocab in (50257, 50304)]
    for compiled, chunked, batch, profile in [
        (False, False, 8, False),
        (False, True, 8, False),
        (True, False, 8, True),
        (True, True, 8, True),
        (True, True, 16, False),
    ]:
        rows.append(training_row(model_dir, out, compiled, chunked, batch, profile))
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    with open(f"{out}/levers.json", "w") as file:
        json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
