#!/bin/bash
# GPU check of the run metrics. usage: bash benchmarks/scripts/check_metrics.sh NPROC PROFILE...
# Per profile: the run (with --profile_memory), an independent sampler of torch.cuda.memory_allocated
# (thread, 5 ms) and nvidia-smi memory.used (200 ms); summaries, logs and TensorBoard events to $OUT.
N=$1; shift
cat > /tmp/by_hand.py <<'PY'
import os, sys, threading, time, torch
device = int(os.environ.get("LOCAL_RANK", 0))
peak = [0]
def sample():
    while True:
        peak[0] = max(peak[0], torch.cuda.memory_allocated(device))
        time.sleep(0.005)
torch.cuda.set_device(device)
threading.Thread(target=sample, daemon=True).start()
from finetune.run import main
try:
    main(sys.argv[1:])
finally:
    print(f"BYHAND rank {os.environ.get('RANK', '0')} sampled_max_allocated_gib {peak[0] / 2**30:.3f} "
          f"torch_max_allocated_since_train_begin_gib {torch.cuda.max_memory_allocated() / 2**30:.3f}", flush=True)
PY
FLAGS="--model gpt2-medium --from_scratch --max_steps 40 --batch_size 8 --block_size 1024 --logging_steps 10
 --throughput_warmup_steps 5 --max_eval_samples 64 --save_strategy no --report_to tensorboard --disable_tqdm true
 --profile_memory"
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)" >> $OUT/gpu.txt
for P in "$@"; do
  nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 200 > $OUT/$P.smi.csv &
  SMI=$!
  FINETUNE_PROFILE=$P accelerate launch --config_file accelerate_configs/$P.yaml --num_processes $N \
    /tmp/by_hand.py $FLAGS --output_dir /tmp/o_$P > $OUT/$P.log 2>&1
  echo "$P rc $?"
  kill $SMI
  cp /tmp/o_$P/run_summary.json $OUT/$P.summary.json
  tar -C /tmp/o_$P -czf $OUT/$P.runs.tgz runs
  grep -A12 "^finetune: completed\|^finetune: failed" $OUT/$P.log; grep BYHAND $OUT/$P.log
done
