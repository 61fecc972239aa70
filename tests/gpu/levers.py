"""Where a GPT-2 training step's time goes, lever by lever, in one process on one GPU (issue 6).

Times the output layer's three matmuls at GPT-2's odd vocabulary and padded to a multiple of 64,
then whole training steps (bf16 autocast, fp32 weights, fused AdamW, dropout on, as run.py trains)
with and without torch.compile and the chunked loss, and a torch.profiler table of one variant.
usage: python tests/gpu/levers.py MODEL_FOLDER OUT_DIR
"""

import json
import statistics
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from finetune.losses import use_chunked_loss

model_dir, out = sys.argv[1], sys.argv[2]
results = []


def bench_output_layer(tokens=8192, hidden=1024):
    import triton.testing

    for vocab in (50257, 50304):
        h = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16)
        ms = triton.testing.do_bench(lambda: (h @ w.T, g @ w, g.T @ h), return_mode="median")
        tflops = 3 * 2 * tokens * hidden * vocab / ms / 1e9
        results.append({"what": f"output layer fwd+bwd matmuls, vocab {vocab}", "ms": ms, "tflops": tflops})
        print(results[-1], flush=True)


def train_steps(compiled, chunked, batch, steps=25, warmup=8, profile=False):
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").cuda().train()
    model.loss_type = "ForCausalLM"
    if chunked:
        use_chunked_loss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_model = torch.compile(model) if compiled else model
    x = torch.randint(0, config.vocab_size, (batch, 1024), device="cuda")
    torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    row = {"what": f"step compile={compiled} chunked_loss={chunked} batch={batch}", "ms": 1000 * median,
           "spread_ms": 1000 * (max(times) - min(times)), "tokens_per_second": batch * 1024 / median,
           "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}
    results.append(row)
    print(row, flush=True)
    if profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
        open(f"{out}/profile_{compiled}_{chunked}_{batch}.txt", "w").write(table)
        print(table[:6000], flush=True)
    del model, step_model, optimizer
    torch.cuda.empty_cache()


bench_output_layer()
train_steps(False, False, 8)
train_steps(False, True, 8)
train_steps(True, False, 8, profile=True)
train_steps(True, True, 8, profile=True)
train_steps(True, True, 16)
json.dump(results, open(f"{out}/levers.json", "w"), indent=1)
