"""The baseline of issue 6: a plain transformers.Trainer script, as tutorials and run_clm.py write it.

bf16, SDPA attention, the Trainer's default optimizer, no torch.compile; the same model (random
init, dropout 0.1), data (WikiText-2 from $FINETUNE_DATA_DIR, packed into 1024-token blocks) and
micro batch as the project's runs. The one addition is a callback that times steps after warm-up
the way finetune's does (synchronized step ends), so the two rates count the same thing.
usage: python benchmarks/scripts/plain_trainer.py MODEL_FOLDER BATCH STEPS OUTPUT_JSON [ACCUMULATION]
   or: accelerate launch --config_file accelerate_configs/ddp.yaml --num_processes N \
           benchmarks/scripts/plain_trainer.py MODEL_FOLDER BATCH STEPS OUTPUT_JSON
(the rates are per GPU, rank 0's steps; peak memory is rank 0's)
"""

import json
import sys
import time

import torch
from plain_common import wikitext_blocks
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

model_dir, batch, steps, output = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
accumulation = int(sys.argv[5]) if len(sys.argv) > 5 else 1  # micro batches per optimizer step
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), attn_implementation="sdpa")
blocks = wikitext_blocks(tokenizer, block=1024)


class StepTimer(TrainerCallback):
    warmup, times, last = 5, [], None

    def on_step_end(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        now = time.perf_counter()
        if self.last is not None and state.global_step > self.warmup:
            self.times.append(now - self.last)
        self.last = now


timer = StepTimer()
args = TrainingArguments(
    output_dir="/tmp/plain_trainer",
    per_device_train_batch_size=batch,
    gradient_accumulation_steps=accumulation,
    max_steps=steps,
    bf16=True,
    logging_steps=10,
    save_strategy="no",
    report_to="none",
)
trainer = Trainer(
    model=model, args=args, train_dataset=blocks, data_collator=default_data_collator, callbacks=[timer]
)
trainer.train()
step = sorted(timer.times)[len(timer.times) // 2]
result = {
    "model": model_dir,
    "processes": args.world_size,
    "micro_batch": batch,
    "gradient_accumulation_steps": accumulation,
    "steps_timed": len(timer.times),
    "step_time_median_s": step,
    "tokens_per_second": batch * accumulation * 1024 / step,
    "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__,
    "loss_curve": [{"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e],
}
if trainer.is_world_process_zero():  # under `accelerate launch --num_processes N`: rank 0's view, per GPU
    print("PLAIN", json.dumps(result))
    with open(output, "w") as file:
        json.dump(result, file, indent=1)
