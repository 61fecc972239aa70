"""A profile's step without finetune, the Trainer or accelerate: torch's own FSDP2 (or DDP, or one
process) around a GPT-2 of a $FINETUNE_DATA_DIR shape from scratch in a hand-written loop, random
tokens already on the GPU. Beside `finetune run` in the same call it says how much of a host-bound
step is the project's layers and how much is torch's: the floor with nothing but torch.

Mirrors what run.py's defaults make of the profile (single, ddp, fsdp, fsdp_grad_op or a copy of
one) through accelerate: FSDP2 with parameters, gradient reduction and outputs in bf16 (the
MixedPrecisionPolicy accelerate builds from bf16 mixed precision, no autocast), units of
`--blocks_per_unit` blocks, resharding after forward as the profile says; DDP with 200 MB buckets and
one process in fp32 under bf16 autocast (accelerate's wrap of the forward); each block's forward
compiled on its own before sharding, the output layer's matmul at an aligned width (run.py's own
`align_output_matmul`), fused AdamW, the gradient clipped at 1.0. Not mirrored: the loss, which
run.py compiles beside the blocks and this loop leaves to the model (eager), and accelerate's FSDP2
units of the embedding and of the output layer (here both in the root's unit). Steps are timed on
the clock finetune's ThroughputCallback uses (CUDA events between step ends, read after the last
step): a synchronize at every step would keep the host from queueing the next step meanwhile and
charge torch alone a latency finetune's steps hide (`host_time_median_s`: until the step was issued).

usage: torchrun --standalone --nproc_per_node N benchmarks/scripts/bare_loop.py --profile fsdp
           [--model gpt2-medium] [--batch 8] [--block 1024] [--steps 20] [--eager] [--out FILE]
           [--trace DIR]
(what `bash benchmarks/run.sh floor ... bare/PROFILE` runs, and `bare_trace/PROFILE` with --trace;
CPU dry run: --config_overrides n_layer=2,n_embd=64,n_head=2 --block 64)
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig, GPT2LMHeadModel

from finetune.arguments import DDP_BUCKET_CAP_MB
from finetune.losses import align_output_matmul
from finetune.profiles import Strategy, load_strategy
from finetune.throughput import CudaEventClock, WallClock

TRACED_STEPS = 3


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="fsdp", help="a profile name or YAML (not DeepSpeed)")
    parser.add_argument("--model", default="gpt2-medium", help="a $FINETUNE_DATA_DIR name or a folder")
    parser.add_argument("--blocks_per_unit", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--config_overrides", default="")
    parser.add_argument("--out")
    parser.add_argument(
        "--trace",
        metavar="DIR",
        help=f"after the timed steps, every rank's torch.profiler trace of {TRACED_STEPS} more, not "
        "synchronized between them (DIR/rank<R>.trace.json, what trace_analysis.py reads)",
    )
    return parser.parse_args()


def write_trace(step: Callable[[], torch.Tensor], folder: str, on_gpu: bool) -> None:
    """The steps profiled as rank_traces.py profiles finetune's, so that trace_analysis.py sets the two
    side by side (finetune's steps are not synchronized one by one either)."""
    from torch.profiler import ProfilerActivity, profile

    Path(folder).mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    with profile(activities=activities) as profiler:
        for _ in range(TRACED_STEPS):
            step()
        if on_gpu:
            torch.cuda.synchronize()
    profiler.export_chrome_trace(f"{folder}/rank{dist.get_rank()}.trace.json")


def build_model(args: argparse.Namespace) -> GPT2LMHeadModel:
    folder = (
        args.model if os.path.isdir(args.model) else os.path.join(os.environ["FINETUNE_DATA_DIR"], args.model)
    )
    config = AutoConfig.from_pretrained(folder)
    if args.config_overrides:
        config.update_from_string(args.config_overrides)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # what run.py names it (finetune.models.name_causal_lm_loss)
    align_output_matmul(model)
    return model


def wrap(model: GPT2LMHeadModel, strategy: Strategy, args: argparse.Namespace, device: torch.device):
    blocks = list(model.transformer.h)
    if not args.eager:
        for block in blocks:
            block.forward = torch.compile(block.forward)
    model.to(device)
    if strategy.framework == "single":
        return model
    if strategy.framework == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=DDP_BUCKET_CAP_MB)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    bf16 = torch.bfloat16
    policy = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)
    if device.type == "cpu":  # run.py trains in fp32 on CPU
        policy = MixedPrecisionPolicy()
    reshard = bool(strategy.reshard_after_forward)
    for start in range(0, len(blocks), args.blocks_per_unit):
        unit = blocks[start : start + args.blocks_per_unit]
        fully_shard(unit, mp_policy=policy, reshard_after_forward=reshard)
    return fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)


def main() -> int:
    args = parse()
    strategy = load_strategy(args.profile)
    if strategy.framework == "deepspeed":
        print(
            f"bare_loop.py: {args.profile} is a DeepSpeed profile; only single, ddp and FSDP2 run bare",
            file=sys.stderr,
        )
        return 2
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # a half-eager loop is no measurement
    on_gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if on_gpu else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    base = build_model(args)
    tokens = torch.randint(0, base.config.vocab_size, (args.batch, args.block), device=device)
    model = wrap(base, strategy, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=on_gpu)
    autocast = strategy.framework != "fsdp" and on_gpu

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            # no KV cache, as finetune's collators ask: its per-layer state made every block's
            # compiled forward recompile until dynamo's limit, the rest then running eager
            loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    losses = [step() for _ in range(args.warmup)]
    clock = CudaEventClock() if on_gpu else WallClock()
    marks, host_s = [clock.mark()], []
    for _ in range(args.steps):
        began = time.perf_counter()
        losses.append(step())
        host_s.append(time.perf_counter() - began)
        marks.append(clock.mark())
    step_s = [clock.seconds(start, end) for start, end in itertools.pairwise(marks)]
    step_time = statistics.median(step_s)
    if args.trace:
        write_trace(step, args.trace, on_gpu)
    result = {
        "tool": "bare_loop.py",
        "profile": args.profile,
        "blocks_per_unit": args.blocks_per_unit if strategy.framework == "fsdp" else None,
        "compiled": not args.eager,
        "world_size": dist.get_world_size(),
        "micro_batch": args.batch,
        "block_size": args.block,
        "steps": args.steps,
        "warmup": args.warmup,
        "step_clock": "cuda_events" if on_gpu else "wall",
        "step_time_median_s": step_time,
        "step_time_spread_s": [min(step_s), max(step_s)],
        "host_time_median_s": statistics.median(host_s),
        "tokens_per_second": args.batch * args.block / step_time,  # per process
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        "loss_curve": [{"step": i + 1, "loss": float(loss)} for i, loss in enumerate(losses)],
        "versions": f"torch {torch.__version__}",
    }
    if dist.get_rank() == 0:
        print(json.dumps({k: v for k, v in result.items() if k != "loss_curve"}))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
