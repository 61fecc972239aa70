"""FSDP2 units as finetune/fsdp_units.py makes them: groups of consecutive blocks, and the units each
one prefetches explicitly, checked on a four-block GPT-2 sharded in a gloo group of one process (the
training they give is checked on two ranks in tests/test_strategies_agree.py)."""

from __future__ import annotations

from launching import one_process_script

# argv: blocks per unit, prefetch depth. Prints each unit's first block and the first blocks of the
# units it prefetches in forward and in backward, after one training step has run through the hooks.
SHARDED_GPT2_SCRIPT = """
import json, torch
from torch.distributed.fsdp import fully_shard
from transformers import GPT2Config, GPT2LMHeadModel, set_seed
from finetune.fsdp_units import blocks_per_unit, prefetch_depth, prefetch_units, transformer_blocks
size, depth = int(sys.argv[2]), int(sys.argv[3])
set_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
blocks = transformer_blocks(model)
with blocks_per_unit(model, size):
    import torch.distributed.fsdp as fsdp
    for block in blocks:
        if not hasattr(block, "_get_fsdp_state"):  # the group's first block sharded the group
            fsdp.fully_shard(block)
fully_shard(model)
prefetch_units(model, depth)
model(torch.randint(0, 64, (2, 16)), labels=torch.randint(0, 64, (2, 16))).loss.backward()
first_block = {}
for index, block in enumerate(blocks):
    first_block.setdefault(id(block._get_fsdp_state()), index)
units = sorted(set(first_block.values()))
def targets(block, attribute):
    return [first_block[id(state)] for state in getattr(block._get_fsdp_state(), attribute)]
print(json.dumps({
    "forward": {index: targets(blocks[index], "_states_to_forward_prefetch") for index in units},
    "backward": {index: targets(blocks[index], "_states_to_backward_prefetch") for index in units},
    "depth": prefetch_depth(model),
}))
"""


def sharded(blocks_per_unit: int, depth: int) -> dict:
    return one_process_script(SHARDED_GPT2_SCRIPT, str(blocks_per_unit), str(depth))


def test_each_unit_prefetches_the_next_units_in_forward_and_the_previous_in_backward_nearest_first():
    units = sharded(blocks_per_unit=1, depth=2)
    assert units["forward"] == {"0": [1, 2], "1": [2, 3], "2": [3], "3": []}
    assert units["backward"] == {"0": [], "1": [0], "2": [1, 0], "3": [2, 1]}
    assert units["depth"] == 2


def test_units_of_several_blocks_prefetch_whole_units():
    units = sharded(blocks_per_unit=2, depth=1)
    assert units["forward"] == {"0": [2], "2": []}
    assert units["backward"] == {"0": [], "2": [0]}
    assert units["depth"] == 1


def test_no_prefetch_leaves_fsdp2_to_prefetch_implicitly():
    units = sharded(blocks_per_unit=1, depth=0)
    assert all(targets == [] for targets in [*units["forward"].values(), *units["backward"].values()])
    assert units["depth"] == 0
