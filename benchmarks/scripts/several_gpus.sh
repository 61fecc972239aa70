#!/bin/bash
# One device call on a 4-GPU machine, its cases in turn, each phase under its own time limit so that a
# slow one cannot take the others' results with it. usage: bash benchmarks/run.sh several_gpus --out DIR CALL
# Every phase writes under DIR/<phase>/; DIR/results.tgz packs them after each phase and at the end (the
# device tool brings 8 files back; a call cut short by the device's limit keeps what ended).
CALL=$1
ROOT=$OUT
pack() { tar -czf /tmp/results.tgz -C "$ROOT" --exclude results.tgz . && mv /tmp/results.tgz "$ROOT/results.tgz"; }
phase() {  # NAME LIMIT_S GPUS COMMAND ARGS... : run.sh COMMAND --out ROOT/NAME on the GPUs listed
  local NAME=$1 LIMIT=$2 GPUS=$3; shift 3
  echo "== $NAME ($GPUS, at most $LIMIT s): $*"
  CUDA_VISIBLE_DEVICES=$GPUS timeout $LIMIT bash benchmarks/run.sh "$1" --out "$ROOT/$NAME" "${@:2}" \
    > "$ROOT/$NAME.out" 2>&1
  echo "== $NAME rc $?"; tail -n 30 "$ROOT/$NAME.out"; pack
}
doctor() {  # NAME GPUS PROFILE ARGS...: finetune doctor on the GPUs listed, its table and JSON kept
  local NAME=$1 GPUS=$2 PROFILE=$3; shift 3
  echo "== doctor $NAME"
  CUDA_VISIBLE_DEVICES=$GPUS timeout 400 python -m finetune doctor --profile $PROFILE \
    --num_processes $(( $(tr -cd , <<< "$GPUS" | wc -c) + 1 )) --model gpt2-medium --from_scratch \
    --output_dir /tmp/doctor-$NAME "$@" > "$ROOT/doctor/$NAME.log" 2>&1; echo "rc $?"
  cp /tmp/doctor-$NAME/doctor.json "$ROOT/doctor/$NAME.json"; tail -n 25 "$ROOT/doctor/$NAME.log"; pack
}
doctor_per_gpu_count() {  # ddp doctor on 1, 2 and all GPUs; beside it, the plain torch loop on 2 and all
  for G in $(printf '%s\n' 1 2 $N | sort -un); do
    GPUS=$(seq -s, 0 $((G - 1)))
    doctor ddp-$G $GPUS ddp
    if [ $G -gt 1 ]; then
      CUDA_VISIBLE_DEVICES=$GPUS timeout 120 torchrun --nproc_per_node $G \
        benchmarks/scripts/collective_loop.py "$ROOT/doctor/torch-$G.json" 2>&1 | tail -n 8
    fi
  done
}
largest_shape() {  # PROFILE: the model `finetune plan --largest` names for it on every GPU of this machine
  local n gib
  n=$(nvidia-smi -L | wc -l)
  gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print int($1/1024)}')
  python -m finetune plan --largest --gpus "$n" --gpu_memory "$gib" --batch_size 1 --gradient_checkpointing \
    --profiles "$1" | awk -F' [|] ' -v p="| $1" '$1 == p {print $2}'
}
stalled_rank() {  # DIR: tests/stalled_run.py on GPUs 0 and 1 under NCCL, rank 1 asleep in step 3
  echo "== a stalled rank on 2 GPUs (NCCL)"
  CUDA_VISIBLE_DEVICES=0,1 timeout 300 python -m finetune.launch --config_file accelerate_configs/ddp.yaml \
    --num_processes 2 --main_process_port 0 tests/stalled_run.py --model gpt2 --from_scratch \
    --config_overrides n_layer=2,n_embd=64,n_head=2 --block_size 32 --batch_size 2 --max_steps 6 \
    --save_steps 2 --logging_steps 1 --max_eval_samples 4 --report_to none --disable_tqdm true \
    --watchdog_s 5 --output_dir /tmp/stalled > "$1/stalled.log" 2>&1; echo "rc $?"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m
  python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)"
} > "$ROOT/gpu.txt" 2>&1
N=$(nvidia-smi -L | wc -l)  # the calls' GPUs: all of this machine's
ALL=$(seq -s, 0 $((N - 1)))
case $CALL in
  1)  # issue 30: planner calibration on 2 GPUs (two pairs at once: peaks do not depend on the neighbour) and 4
    phase n2-a 200 0,1 calibrate 2 "gpt2-medium gpt2-xl" "ddp zero3" 8 &
    phase n2-b 200 2,3 calibrate 2 "gpt2-medium gpt2-xl" "zero2 fsdp" 8 &
    wait
    phase n4 230 0,1,2,3 calibrate 4 "gpt2-medium gpt2-xl" "ddp zero3 fsdp zero2" 8
    phase two-launchers 100 0,1,2,3 two_launchers 2 zero3
    ;;
  2)  # issue 30: compiled (the profiles' default) calibration rows on all GPUs, beside resume N -> N/2 of
    # two more profiles on the same GPUs (peaks do not depend on the neighbour; these speeds are not results)
    COMPILE=1 phase n$N-compiled 420 $ALL calibrate $N "gpt2-medium gpt2-xl" "ddp zero3 fsdp" 8 20 &
    phase resume 400 $ALL resume_matches $N zero2 ddp &
    wait
    ;;
  3)  # issue 29: gpt2-medium on all GPUs, finetune's defaults beside the plain Trainer script launched with
    # the same profile, micro batch 8 x block 1024, 30 steps, one run each, in turn (timings)
    mkdir -p "$ROOT/speed"
    for P in ddp zero3 fsdp; do
      echo "== $P plain"
      timeout 150 accelerate launch --config_file accelerate_configs/$P.yaml --num_processes $N \
        --main_process_port 0 benchmarks/scripts/plain_trainer.py $FINETUNE_DATA_DIR/gpt2-medium 8 30 \
        "$ROOT/speed/$P.plain.json" > "$ROOT/speed/$P.plain.log" 2>&1; echo "rc $?"
      echo "== $P finetune"
      timeout 200 python -m finetune run --profile $P --num_processes $N --model gpt2-medium --from_scratch \
        --max_steps 30 --batch_size 8 --block_size 1024 --logging_steps 10 --max_eval_samples 16 \
        --save_strategy no --report_to none --disable_tqdm true --output_dir /tmp/speed_$P \
        > "$ROOT/speed/$P.finetune.log" 2>&1; echo "rc $?"
      cp /tmp/speed_$P/run_summary.json "$ROOT/speed/$P.finetune.json"
      tar -czf /tmp/results.tgz -C "$ROOT" speed && mv /tmp/results.tgz "$ROOT/results.tgz"  # if cut short
    done
    ;;
  4)  # issue 32: finetune doctor on 1, 2 and all GPUs beside a plain torch loop timed with CUDA events;
    # doctor under the offload profiles (op builds, host RAM, NVMe speed); run --doctor; a stalled rank
    mkdir -p "$ROOT/doctor"
    doctor_per_gpu_count
    doctor zero3_offload-2 0,1 zero3_offload
    doctor zero3_nvme-2 0,1 zero3_nvme --nvme_path /tmp/nvme
    echo "== run --doctor"
    timeout 300 python -m finetune run --profile ddp --num_processes $N --doctor --model gpt2 --from_scratch \
      --max_steps 20 --max_eval_samples 16 --report_to none --disable_tqdm true --output_dir /tmp/run-doctor \
      > "$ROOT/doctor/run-doctor.log" 2>&1; echo "rc $?"; tail -n 15 "$ROOT/doctor/run-doctor.log"
    cp /tmp/run-doctor/run_summary.json "$ROOT/doctor/run-doctor.summary.json"
    stalled_rank "$ROOT/doctor"
    tail -n 5 "$ROOT/doctor/stalled.log"; cp -r /tmp/stalled/hang-step* "$ROOT/doctor/" 2>/dev/null
    ls -la "$ROOT"/doctor/hang-step*
    ;;
  6)  # issue 32, the bandwidth part of call 4 alone (a short call): doctor and the torch loop on 1, 2, N GPUs
    mkdir -p "$ROOT/doctor"
    doctor_per_gpu_count
    ;;
  5)  # issue 31: every run checks the Launch and compile plan it resolved against accelerate's; on GPUs,
    # where the profiles compile by default (whole, per block, ZeRO-3 blocks, CUDA graphs), 20 steps each
    mkdir -p "$ROOT/launch"
    for P in single ddp fsdp zero2 zero3 zero3_offload; do
      G=$([ $P = single ] && echo 1 || echo 2)
      echo "== $P on $G GPU(s)"
      timeout 240 python -m finetune run --profile $P --num_processes $G --model gpt2 --from_scratch \
        --max_steps 20 --max_eval_samples 16 --save_strategy no --report_to none --disable_tqdm true \
        --output_dir /tmp/launch-$P > "$ROOT/launch/$P.log" 2>&1; echo "rc $?"; tail -n 4 "$ROOT/launch/$P.log"
      cp /tmp/launch-$P/run_summary.json "$ROOT/launch/$P.json"
      python -c "import json,sys; s=json.load(open(sys.argv[1])); print({k: s.get(k) for k in ('status','strategy','world_size','torch_compile','torch_compile_regional','torch_compile_mode','loss_compiled','zero3_compiled_blocks','tokens_per_second_per_device')})" "$ROOT/launch/$P.json"
    done
    stalled_rank "$ROOT/launch"
    grep "no optimizer step ended" "$ROOT/launch/stalled.log"
    ;;
  7)  # a lone process with every GPU visible (the single profile, as `finetune run` and `accelerate launch`
    # start it) trains on one GPU, not nn.DataParallel over all: its trained tokens are its tokens less
    # each row's first (DataParallel's replicas raced the counter: 0.5 of them on 2 GPUs in call 5)
    mkdir -p "$ROOT/single"
    FLAGS="--model gpt2 --from_scratch --max_steps 20 --max_eval_samples 16 --save_strategy no --report_to none --disable_tqdm true"
    for HOW in run launch; do
      if [ $HOW = run ]; then
        timeout 240 python -m finetune run --profile single $FLAGS --output_dir /tmp/single-$HOW > "$ROOT/single/$HOW.log" 2>&1
      else
        timeout 240 accelerate launch --config_file accelerate_configs/single.yaml finetune/run.py $FLAGS \
          --output_dir /tmp/single-$HOW > "$ROOT/single/$HOW.log" 2>&1
      fi
      echo "== single by $HOW: rc $?"; grep "trains on one GPU" "$ROOT/single/$HOW.log"; tail -n 4 "$ROOT/single/$HOW.log"
      cp /tmp/single-$HOW/run_summary.json "$ROOT/single/$HOW.json"
      python -c "import json,sys; s=json.load(open(sys.argv[1])); print({k: s.get(k) for k in ('status','world_size','tokens_per_second','trained_tokens_per_second','memory_peak_allocated_gib_max')})" "$ROOT/single/$HOW.json"
    done
    ;;
  8)  # issue 38 target 4 and issue 39 target 3: LoRA beside full fine-tuning under the sharded profiles
    # (saved random weights: --peft refuses --from_scratch), then zero3_nvme on all GPUs with doctor's row
    python benchmarks/scripts/save_initialised.py gpt2-medium /tmp/gpt2-medium-init
    RUN_TIMEOUT=100 phase lora 330 $ALL floor /tmp/gpt2-medium-init 8 20 fsdp fsdp:--peft,lora zero3 \
      zero3:--peft,lora
    mkdir -p "$ROOT/doctor" "$ROOT/nvme"
    doctor zero3_nvme-$N $ALL zero3_nvme --nvme_path /tmp/nvme
    timeout 150 python -m finetune run --profile zero3_nvme --num_processes $N --model gpt2 --from_scratch \
      --nvme_path /tmp/nvme-run --max_steps 20 --max_eval_samples 16 --save_strategy no --report_to none \
      --disable_tqdm true --output_dir /tmp/nvme-run-out > "$ROOT/nvme/zero3_nvme.log" 2>&1; echo "nvme rc $?"
    cp /tmp/nvme-run-out/run_summary.json "$ROOT/nvme/zero3_nvme.json"
    ;;
  9)  # issue 39 target 4: `finetune plan --largest --gpus N` for zero3 and fsdp, each trained for 4 steps
    for P in zero3 fsdp; do
      SHAPE=$(largest_shape $P)
      echo "== largest $P on $N GPUs: $SHAPE"
      LARGEST_TIMEOUT=260 phase largest-$P 280 $ALL largest $N $P $SHAPE
    done
    ;;
  10)  # issue 42: ring attention (--sequence_parallel under fsdp) on 2 GPUs: its equality tests, then a 1B
    # Llama at 16k tokens unsplit and split, compiled (untried under the ring) and eager
    mkdir -p "$ROOT/ring"
    CUDA_VISIBLE_DEVICES=0,1 timeout 330 python -m pytest -q -n 0 -p no:cacheprovider \
      tests/test_sequence_parallel_runs.py -k "ring or fsdp" > "$ROOT/ring/tests.log" 2>&1
    echo "ring tests rc $?"; tail -n 15 "$ROOT/ring/tests.log"
    SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > /dev/null
    PROFILE=fsdp STEPS=6 RUN_TIMEOUT=120 phase ring-compiled 250 0,1 long_context /tmp/llama-1b 2 2 16384
    PROFILE=fsdp STEPS=6 RUN_TIMEOUT=120 RUN_FLAGS="--torch_compile false" phase ring-eager 250 0,1 \
      long_context /tmp/llama-1b 2 2 16384
    ;;
  11)  # issue 38 target 4: LoRA against full fine-tuning where model states dominate (gpt2-xl with gradient
    # checkpointing), then gpt2-medium's ZeRO-3 LoRA with leaf blocks (adapters gathered by block since 2026-11-28c)
    python benchmarks/scripts/save_initialised.py gpt2-xl /tmp/gpt2-xl-init
    RUN_TIMEOUT=125 phase lora-xl 520 $ALL floor /tmp/gpt2-xl-init 8 20 fsdp:--gradient_checkpointing,true \
      fsdp:--peft,lora,--gradient_checkpointing,true zero3:--gradient_checkpointing,true \
      zero3:--peft,lora,--gradient_checkpointing,true
    ;;
  12)  # issue 39 targets 3 and 4: zero3_nvme completed on all GPUs (the last profile not yet run on 4) with
    # doctor's NVMe row beside it; the zero3 --largest shape for 20 steps
    mkdir -p "$ROOT/nvme" "$ROOT/doctor"
    timeout 200 python -m finetune run --profile zero3_nvme --num_processes $N --model gpt2 --from_scratch \
      --nvme_path /tmp/nvme-run --max_steps 10 --logging_steps 5 --max_eval_samples 8 --save_strategy no \
      --report_to none --disable_tqdm true --output_dir /tmp/nvme-run-out > "$ROOT/nvme/zero3_nvme.log" 2>&1
    echo "nvme rc $?"; cp /tmp/nvme-run-out/run_summary.json "$ROOT/nvme/zero3_nvme.json"; pack
    LARGEST_TIMEOUT=250 phase largest-zero3 260 $ALL largest $N zero3 "$(largest_shape zero3)" 20
    doctor zero3_nvme-$N $ALL zero3_nvme --nvme_path /tmp/nvme
    ;;
  13)  # issue 38: ZeRO-1/2 with DeepSpeed's 500M-value reduce buckets (1.53x "auto"'s hidden² on one
       # H200) beside the old "auto", ddp and zero3: does it hold where the reduction could overlap?
    RUN_TIMEOUT=100 phase zero-stages 560 $ALL floor gpt2-medium 8 20 ddp zero2 \
      'zero2~ds.zero_optimization.reduce_bucket_size="auto"' zero1 zero3 'zero2#r2'
    ;;
  14)  # issue 39 target 4, fsdp: the --largest shape for 20 steps, its host memory with only rank 0 drawing
    LARGEST_TIMEOUT=520 phase largest-fsdp 540 $ALL largest $N fsdp "$(largest_shape fsdp)" 20
    ;;
  15)  # issue 39 target 2: resume on half the GPUs for the two profiles that shard parameters, zero3 and
    # fsdp (N -> N/2; ddp and zero2 were shown 2 -> 1): uninterrupted vs SIGTERM + resume vs resumed on N/2
    phase resume-zero3 290 $ALL resume_matches $N zero3
    phase resume-fsdp 290 $ALL resume_matches $N fsdp
    ;;
  16)  # issue 39 target 1: the Llamas under zero3 with DeepSpeed's linear off (the stage-3 JSONs since
    # h200x2-2026-11-29b; the calibration rows had it on), their compiled peaks as rows; issue 38: DDP's
    # gradients as bucket views (4 bytes a parameter less) against copies on the 1B Llama, twice each
    (SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b; python benchmarks/scripts/make_llama.py /tmp/llama-0.36b) > /dev/null
    COMPILE=1 phase llama-zero3 200 $ALL calibrate $N "/tmp/llama-1b /tmp/llama-0.36b" "zero3" 8
    RUN_TIMEOUT=90 phase bucket-views 330 $ALL floor /tmp/llama-1b 8 20 ddp ddp:--ddp_gradient_as_bucket_view,true \
      'ddp#r2' 'ddp:--ddp_gradient_as_bucket_view,true#r2'
    ;;
  18|19)  # issue 38 target 4: LoRA spending the memory it frees on a larger micro batch (on two H200,
    # h200x2-2026-11-30c: the LoRA step is host-bound on the adapters' launches, and CUDA graphs under
    # checkpointing re-record or fail, so they are refused): full fine-tuning at micro batch 8 and 16
    # beside LoRA at 16 and 32, gpt2-xl checkpointed, the pair of the target twice; 18 fsdp, 19 zero3
    P=$([ "$CALL" = 18 ] && echo fsdp || echo zero3)
    python benchmarks/scripts/save_initialised.py gpt2-xl /tmp/gpt2-xl-init
    RUN_TIMEOUT=110 phase lora-batch-$P 530 $ALL floor /tmp/gpt2-xl-init - 20 \
      $P:--gradient_checkpointing,true,--batch_size,8 $P:--peft,lora,--gradient_checkpointing,true,--batch_size,16 \
      "$P:--gradient_checkpointing,true,--batch_size,8#r2" "$P:--peft,lora,--gradient_checkpointing,true,--batch_size,16#r2" \
      $P:--gradient_checkpointing,true,--batch_size,16 $P:--peft,lora,--gradient_checkpointing,true,--batch_size,32
    ;;
  20|21)  # issue 39 target 1: compiled peaks where calibration.json has none on this many GPUs (zero1,
    # zero2 and fsdp_grad_op past gpt2-medium at micro batch 8; the 1B Llama beside them and under ddp
    # at 16): 20 gpt2-xl at micro batch 16, 21 the 1B Llama at 8, 4 steps each with --profile_memory
    if [ "$CALL" = 20 ]; then
      # zero2 at 8 is a row from two H200 (h200x2-2026-11-30d; zero1 peaked the same there), and the
      # whole-model compiles take 100-130 s to their first step
      CALIBRATE_TIMEOUT=180 COMPILE=1 phase cal-xl 560 $ALL calibrate $N gpt2-xl "zero1 zero2 fsdp_grad_op" 16
    else
      SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > /dev/null
      CALIBRATE_TIMEOUT=150 COMPILE=1 phase cal-llama 500 $ALL calibrate $N /tmp/llama-1b \
        "zero1 zero2 fsdp_grad_op" 8
      # ddp on one process is the single profile's peak (rows of single at 16 exist)
      [ "$N" -gt 1 ] && CALIBRATE_TIMEOUT=100 COMPILE=1 phase cal-llama-ddp 100 $ALL calibrate $N /tmp/llama-1b ddp 16
    fi
    ;;
  22)  # `--profile auto`'s global batch rule on this GPU count: every profile at the micro batch it plans
    # for a share of 32 a GPU, gpt2-xl (on two H200, h200x2-2026-11-30e, every one compiled block by
    # block, 33-51 s to a first step: fsdp_grad_op 1.10x ddp's 16 x 2, the planner's pick)
    G=--global_batch_size,$((32 * N))
    RUN_TIMEOUT=110 phase global-batch 570 $ALL floor gpt2-xl - 15 "fsdp_grad_op:$G" "ddp:$G" "zero2:$G" \
      "fsdp:$G" "zero3:$G" "zero1:$G"
    ;;
  23)  # the sharding floor: finetune's ddp and FSDP2 profiles beside the same in a hand-written torch loop
    # (bare_loop.py: no finetune, Trainer or accelerate) at micro batch 8 and at one sample of 64 tokens
    # (the host's floor; on one H200, h200-2026-11-30b, fsdp_grad_op's step at 8 was its floor)
    RUN_TIMEOUT=80 phase bare-b8 320 $ALL floor gpt2-medium 8 20 ddp bare/ddp fsdp bare/fsdp fsdp_grad_op \
      bare/fsdp_grad_op
    BLOCK=64 RUN_TIMEOUT=70 phase bare-b1 260 $ALL floor gpt2-medium 1 20 ddp bare/ddp fsdp bare/fsdp \
      fsdp_grad_op bare/fsdp_grad_op
    ;;
  24)  # the sharding floor: every rank's trace of finetune's FSDP2 step beside torch alone's (bare_loop.py)
    # at micro batch 8, then the untraced pair (on the slower of two 2-H200 hosts, h200x2-2026-11-30f,
    # finetune's fsdp step was 1.32x torch alone's; fsdp_grad_op's 1.02x)
    RUN_TIMEOUT=150 phase traces 520 $ALL floor gpt2-medium 8 20 trace/fsdp bare_trace/fsdp trace/fsdp_grad_op \
      bare_trace/fsdp_grad_op fsdp bare/fsdp
    ;;
  25)  # the sharding floor: batches page-locked and copied non-blocking (run.py's default on GPUs since
    # h200x2-2026-12-01 found them never pinned) against the copies every earlier run made, beside torch
    # alone, each pair twice; then rank 0's host syncs a step under the new default (trace/: 5.3 before)
    OLD=--dataloader_pin_memory,false
    RUN_TIMEOUT=90 phase copies 540 $ALL floor gpt2-medium 8 20 fsdp "fsdp:$OLD" bare/fsdp fsdp_grad_op \
      "fsdp_grad_op:$OLD" bare/fsdp_grad_op 'fsdp#r2' "fsdp:$OLD#r2" 'bare/fsdp#r2' 'fsdp_grad_op#r2' \
      "fsdp_grad_op:$OLD#r2" 'bare/fsdp_grad_op#r2' trace/fsdp
    ;;
  26)  # the sharding floor untraced: every process sampled by py-spy (host_samples.py: each rank's host
    # time in the loop, by what) under finetune and torch alone at micro batch 8; torch.profiler doubled
    # the FSDP2 step it traced and showed finetune's host no busier than torch's where untraced finetune's
    # step was 1.07-1.34 of torch's (h200x2-2026-12-01). The unsampled pair last: py-spy's own cost.
    # Needs py-spy staged: bash ../shared/gpu/stage.sh trl==1.16.0 liger-kernel==0.8.5 py-spy==0.4.3
    RUN_TIMEOUT=100 phase spy 540 $ALL floor gpt2-medium 8 40 SPY=1+fsdp SPY=1+bare/fsdp SPY=1+fsdp_grad_op \
      SPY=1+bare/fsdp_grad_op SPY=1+ddp SPY=1+bare/ddp fsdp bare/fsdp
    ;;
  27)  # the sharding floor: transformers' padding check and packed-example probe (three host syncs a
    # forward) left out of training since 0984b53, against that tree (`base/`: page-locked batches, both
    # on) and torch alone on finetune's clock, fsdp and fsdp_grad_op, each twice (on one GPU no sync
    # was left in a traced step but the tracer's). Needs the older tree beside this one, carried:
    # mkdir .baseline && git archive 0984b53 | tar -x -C .baseline && echo /.baseline/ >> .git/info/exclude
    BASELINE=$PWD/.baseline RUN_TIMEOUT=90 phase padding-check 540 $ALL floor gpt2-medium 8 20 fsdp base/fsdp \
      bare/fsdp fsdp_grad_op base/fsdp_grad_op bare/fsdp_grad_op 'fsdp#r2' 'base/fsdp#r2' 'bare/fsdp#r2' \
      'fsdp_grad_op#r2' 'base/fsdp_grad_op#r2' 'bare/fsdp_grad_op#r2'
    ;;
  30)  # the sharding floor: ZeRO-3's gradient norm in one torch._foreach_norm (finetune/zero3_grad_norm.py)
    # and read as the engine's tensor (accelerate's reading calls .item() every step: finetune/trainer.py)
    # against the tree before both (`base/`), three times each, alternating, then both sampled by py-spy:
    # on one process the norm cut the host's time, not the step; here every rank's GPU waits on its
    # host. Every rank's traces (trace/) say which of the two moved it. Needs that tree beside this one, carried:
    # mkdir .baseline && git archive 3122ccb | tar -x -C .baseline && echo /.baseline/ >> .git/info/exclude
    BASELINE=$PWD/.baseline RUN_TIMEOUT=90 phase zero3-norm 540 $ALL floor gpt2-medium 8 20 base/zero3 zero3 \
      'base/zero3#r2' 'zero3#r2' 'base/zero3#r3' 'zero3#r3' SPY=1+base/zero3 SPY=1+zero3 trace/zero3
    ;;
  31)  # the sharding floor: ZeRO-1/2's bf16 overflow check (six operations per gradient partition and an
    # `.item()` every step) is off in the shipped JSON; DeepSpeed's default turned back on beside them
    # and ddp, each twice, to see what it costs where the ranks also wait for each other
    RUN_TIMEOUT=90 phase zero1-overflow 540 $ALL floor gpt2-medium 8 20 ddp zero1 \
      'zero1~ds.bf16.check_grad_overflow=true' zero2 'zero2~ds.bf16.check_grad_overflow=true' 'ddp#r2' \
      'zero1#r2' 'zero1~ds.bf16.check_grad_overflow=true#r2' 'zero2#r2' 'zero2~ds.bf16.check_grad_overflow=true#r2'
    ;;
  32)  # the sharding floor: CUDA graphs (--torch_compile_mode reduce-overhead) under ddp, zero1 and zero2,
    # whose reduce hooks run on NCCL between the graphs' replays; on one process they made ZeRO-1/2's
    # host-bound step 1.25-1.67x faster and ddp's no slower (h200-2026-12-01g). Each case twice, alternating
    G=--torch_compile_mode,reduce-overhead
    RUN_TIMEOUT=90 phase graphs 560 $ALL floor gpt2-medium 8 20 ddp ddp:$G zero1 zero1:$G zero2 zero2:$G \
      'ddp#r2' "ddp:$G#r2" 'zero1#r2' "zero1:$G#r2" 'zero2#r2' "zero2:$G#r2"
    ;;
  33)  # the sharding floor, before CUDA graphs become ddp's and ZeRO-1/2's default: graphs through a
    # SIGTERM, a resume and a resume on half the GPUs, evaluations mid-run of a short last batch (61
    # samples), beside the same under torch.compile's default mode; ddp's DDP wrapper only, as one GPU
    # checked ZeRO-1/2 (h200-2026-12-04b)
    export EXTRA="--eval_strategy steps --eval_steps 20 --max_eval_samples 61"
    MODE=reduce-overhead phase graphs-resume 300 $ALL resume_matches $N ddp
    MODE=default phase default-resume 250 $ALL resume_matches $N ddp
    python benchmarks/scripts/tables.py resume_modes "$ROOT/graphs-resume" "$ROOT/default-resume" \
      > "$ROOT/modes_table.md" 2>&1
    ;;
  34)  # the sharding floor: FSDP2's explicit prefetch (--fsdp_prefetch N: each unit issues the next N
    # units' all-gathers as its forward starts, not when the host reaches them) at the default 4 blocks a
    # unit and at 1 (24 units, where the implicit prefetch waits on the host most), each case twice
    P=--fsdp_prefetch; ONE=--fsdp_blocks_per_unit,1
    RUN_TIMEOUT=80 phase prefetch 560 $ALL floor gpt2-medium 8 20 fsdp fsdp:$P,1 fsdp:$P,2 fsdp:$ONE \
      fsdp:$ONE,$P,1 'fsdp#r2' "fsdp:$P,1#r2" "fsdp:$P,2#r2" "fsdp:$ONE#r2" "fsdp:$ONE,$P,1#r2"
    ;;
  35)  # the planner on several GPUs: FSDP2's compiled peaks at micro batch 8 hold about 4.4 bytes a
    # parameter x (1 - 1/N) more than on one GPU less the sharded states (every model and N measured; a
    # CPU allocation census of 1 and 2 gloo ranks found none: docs/planner.md, "FSDP2's gathered copies").
    # What is alive at the peak, gpt2-xl under fsdp and fsdp_grad_op on 1 and on 2 GPUs
    TOOL=memory_snapshot MODEL=gpt2-xl BATCH=8 NPROC=1 phase snapshot-1 270 0 profile fsdp fsdp_grad_op
    TOOL=memory_snapshot MODEL=gpt2-xl BATCH=8 NPROC=2 phase snapshot-2 270 0,1 profile fsdp fsdp_grad_op
    ;;
  36)  # the sharding floor, a lever not yet timed: ZeRO++ on zero3, its weights all-gathered in int8
    # (zero_quantized_weights, qwZ) and its gradients reduced in int4 through an all-to-all
    # (zero_quantized_gradients, qgZ), each beside plain zero3 twice; DeepSpeed builds its quantizer
    # op on first use (nvcc), in the first qwZ case. hpZ (zero_hpz_partition_size) partitions within
    # a node for several nodes: on one node it is the whole world, nothing to time
    Q=ds.zero_optimization.zero_quantized
    RUN_TIMEOUT=120 phase zeropp 560 $ALL floor gpt2-medium 8 20 zero3 "zero3~${Q}_weights=true" \
      "zero3~${Q}_weights=true~${Q}_gradients=true" 'zero3#r2' "zero3~${Q}_weights=true#r2" \
      "zero3~${Q}_weights=true~${Q}_gradients=true#r2"
    ;;
  37)  # the sharding floor, a lever not yet timed: NCCL's kernels against the compute for the SMs. FSDP2's
    # collectives took 15-20x their isolated time in training; fewer CTAs for NCCL (NCCL_MAX_CTAS=4)
    # leave more SMs to the blocks, high-priority NCCL streams (TORCH_NCCL_HIGH_PRIORITY=1) let its
    # kernels start first; each beside fsdp's default twice, alternating
    RUN_TIMEOUT=80 phase nccl-sms 560 $ALL floor gpt2-medium 8 20 fsdp NCCL_MAX_CTAS=4+fsdp \
      TORCH_NCCL_HIGH_PRIORITY=1+fsdp 'fsdp#r2' 'NCCL_MAX_CTAS=4+fsdp#r2' 'TORCH_NCCL_HIGH_PRIORITY=1+fsdp#r2'
    ;;
  38)  # the sharding floor, a lever not yet timed: ZeRO-3's gradient reduce bucket. The stage-3 JSON's
    # 500M values (faster than transformers' "auto", hidden^2, on one process) hold all of gpt2-medium's
    # gradients, so its one reduce-scatter starts after the backward, in the epilogue (a CPU profile of
    # one process: cpu-2026-12-05-zero3-host), where a two-H200 trace had it wait 42 ms a step; buckets of
    # 50M and 20M values reduce during the backward as DDP's do. Each beside the default twice, alternating
    B='~ds.zero_optimization.reduce_bucket_size'
    RUN_TIMEOUT=80 phase zero3-buckets 560 $ALL floor gpt2-medium 8 20 zero3 "zero3$B=50000000" \
      "zero3$B=20000000" 'zero3#r2' "zero3$B=50000000#r2" "zero3$B=20000000#r2"
    ;;
  28|29)  # issue 42 target 6, its rates: the 1B Llama from scratch, checkpointed, micro batch 1, at 16k and
    # 64k tokens unsplit and split over every GPU (tokens/s per GPU, MFU, peaks beside `finetune plan`);
    # 28 zero3 (Ulysses), 29 fsdp (ring attention). The longest blocks are a case a call (benchmarks/README.md).
    P=$([ "$CALL" = 28 ] && echo zero3 || echo fsdp)
    SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > /dev/null
    for i in 1 2 3 4 5 6 7 8; do cat "$FINETUNE_DATA_DIR/tiny-shakespeare/input.txt"; done > /tmp/long.txt
    PROFILE=$P STEPS=6 WARMUP=2 RUN_TIMEOUT=130 \
      RUN_FLAGS="--dataset /tmp/long.txt --validation_split_percentage 25 --chunked_loss true" \
      phase long-$P 560 $ALL long_context /tmp/llama-1b $N $N 16384 65536
    ;;
  *) echo "several_gpus.sh: unknown call $CALL" >&2; exit 2 ;;
esac
pack
