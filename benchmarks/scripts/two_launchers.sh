#!/bin/bash
# Two machines on one host: usage: bash benchmarks/scripts/two_launchers.sh NPROC_PER_MACHINE PROFILE...
# Per profile, gpt2 (124M) from scratch, 30 eager steps without dropout: one `finetune run` of 2 x N
# processes, then two `finetune run`s of N processes each (--num_machines 2, --machine_rank 0 and 1,
# rendezvous at 127.0.0.1), each seeing its own N GPUs, as `finetune slurm`'s job starts one per node.
# The two runs should end at the same eval loss; tables.py two_launchers compares them.
N=$1; shift
FLAGS="--model gpt2 --from_scratch --max_steps 30 --batch_size 8 --block_size 512 --logging_steps 5
 --max_eval_samples 64 --report_to none --disable_tqdm true --torch_compile false --save_strategy no
 --config_overrides resid_pdrop=0,embd_pdrop=0,attn_pdrop=0"
for P in "$@"; do
  echo "== $P: one launcher, $((2 * N)) processes"
  timeout 300 python -m finetune run --profile $P --num_processes $((2 * N)) $FLAGS --output_dir /tmp/tl_${P}_one \
    > $OUT/$P.one-launcher.log 2>&1; echo "rc $?"
  cp /tmp/tl_${P}_one/run_summary.json $OUT/$P.one-launcher.json
  echo "== $P: two launchers of $N processes"
  PORT=$((29700 + RANDOM % 200))
  for R in 0 1; do
    CUDA_VISIBLE_DEVICES=$(seq -s, $((R * N)) $((R * N + N - 1))) timeout 300 python -m finetune run --profile $P \
      --num_processes $((2 * N)) --num_machines 2 --machine_rank $R --main_process_ip 127.0.0.1 \
      --main_process_port $PORT $FLAGS --output_dir /tmp/tl_${P}_two > $OUT/$P.two-launchers.machine$R.log 2>&1 &
  done
  wait; echo "rc $?"
  cp /tmp/tl_${P}_two/run_summary.json $OUT/$P.two-launchers.json
  rm -rf /tmp/tl_${P}_*
done
python benchmarks/scripts/tables.py two_launchers $OUT "$@" | tee $OUT/two_launchers_table.md
