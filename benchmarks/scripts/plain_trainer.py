"""The baseline of issue 6: a plain transformers.Trainer script, as tutorials and run_clm.py write it.

bf16, SDPA attention, the Trainer's default optimizer, no torch.compile; the same model (random
init, dropout 0.1), data (WikiText-2 from $FINETUNE_DATA_DIR, packed into 1024-token blocks) and
micro batch as the project's runs. The one addition is a callback that times steps after warm-up
the way finetune's does (synchronized step ends), so the two rates count the same thing.
usage: python benchmarks/scripts/plain_trainer.py MODEL_FOLDER BATCH STEPS OUTPUT_JSON
   or: accelerate launch --config_file accelerate_configs/ddp.yaml --num_processes N \
           benchmarks/scripts/plain_trainer.py MODEL_FOLDER BATCH STEPS OUTPUT_JSON
(the rates are per GPU, rank 0's steps; peak memory is rank 0's)
"""

import json
import os
import sys
import time
from itertools import chain

import torch
from datasets import load_dataset
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
data_dir = os.path.join(os.environ["FINETUNE_DATA_DIR"], "wikitext-2-v1")
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), attn_implementation="sdpa")
raw = load_dataset("text", data_files={"train": f"{data_dir}/wiki.valid.tokens"}, keep_linebreaks=True)
tokens = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])


def group_texts(examples, block=1024):
    joined = {k: list(chain(*examples[k])) for k in examples}
    length = len(joined["input_ids"]) // block * block
    result = {k: [t[i : i + block] for i in range(0, length, block)] for k, t in joined.items()}
    result["labels"] = result["input_ids"].copy()
    return result


blocks = tokens.map(group_texts, batched=True, batch_size=10_000)["train"]


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
    "steps_timed": len(timer.times),
    "step_time_median_s": step,
    "tokens_per_second": batch * 1024 / step,
    "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__,
    "loss_curve": [{"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e],
}
if trainer.is_world_process_zero():  # under `accelerate launch --num_processes N`: rank 0's view, per GPU
    print("PLAIN", json.dumps(result))
    with open(output, "w") as file:
        json.dump(result, file, indent=1)
