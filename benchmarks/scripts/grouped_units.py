"""A lever of the sharding floor, measured before it is built into the package: FSDP2 units of GROUP
consecutive transformer blocks instead of one (fewer all-gathers and hooks per step, each larger).

finetune/run.py as it is, with accelerate's FSDP2 preparation wrapped: while it runs, torch's
`fully_shard` called on the first block of each group shards the whole group as one unit (FSDP2
takes a list of modules); the group's other blocks are then FSDP modules already, which accelerate
skips. usage: GROUP=2 accelerate launch --config_file accelerate_configs/fsdp.yaml \\
           benchmarks/scripts/grouped_units.py [run.py flags]
"""

import os
import sys

import accelerate.accelerator
import torch.distributed.fsdp

import finetune.run as run

GROUP = int(os.environ.get("GROUP", "2"))
prepare = accelerate.accelerator.fsdp2_prepare_model


def prepare_grouped(accelerator, model):
    classes = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [module for module in model.modules() if type(module).__name__ in classes]
    groups = {id(blocks[i]): blocks[i : i + GROUP] for i in range(0, len(blocks), GROUP)}
    shard = torch.distributed.fsdp.fully_shard

    def fully_shard(module, **kwargs):
        return shard(groups.get(id(module), module), **kwargs)

    torch.distributed.fsdp.fully_shard = fully_shard
    try:
        prepared = prepare(accelerator, model)
    finally:
        torch.distributed.fsdp.fully_shard = shard
    units = {id(module._get_fsdp_state()) for module in prepared.modules() if module in blocks}
    if accelerator.is_main_process:
        print(f"GROUPED {len(blocks)} blocks into {len(units)} FSDP units of up to {GROUP}")
    return prepared


if __name__ == "__main__":
    accelerate.accelerator.fsdp2_prepare_model = prepare_grouped
    run.main(sys.argv[1:])
