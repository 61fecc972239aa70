"""How a launch's processes divide the work: the parallel dimensions, validated once and only read.

In the spirit of torchtitan's `ParallelDims` and accelerate's `ParallelismConfig` (whose
`PARALLELISM_CONFIG_*` variables, set by `accelerate launch` from a profile's `parallelism_config`,
are the source here): every process is a data-parallel rank unless a sequence-parallel group splits
one sample's tokens over several. The planner, doctor, the batch geometry and the throughput count
ask this layout for the sizes they need, never the world size, so a new degree is one field here.

ZeRO and FSDP2 shard their states over every process, the sequence group's included (DeepSpeed's
sequence-data-parallel group, accelerate's `dp_shard_cp` mesh): the shard group is the world.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from finetune.errors import FinetuneError

PARALLELISM_PREFIX = "PARALLELISM_CONFIG_"


@dataclass(frozen=True)
class ParallelLayout:
    world_size: int = 1
    sequence_parallel: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.sequence_parallel < 1:
            raise FinetuneError(
                f"a layout of {self.world_size} process(es) with sequence parallel degree "
                f"{self.sequence_parallel}: both must be at least 1"
            )
        if self.world_size % self.sequence_parallel:
            raise FinetuneError(
                f"a sequence parallel degree of {self.sequence_parallel} does not divide the "
                f"{self.world_size} processes: each sample's group must be whole"
            )

    @property
    def data_parallel_size(self) -> int:
        """Processes that each take their own share of every global batch."""
        return self.world_size // self.sequence_parallel

    @property
    def shard_group_size(self) -> int:
        """Processes a sharding strategy divides its sharded states over."""
        return self.world_size

    @property
    def devices(self) -> int:
        """What a per-device rate divides by: every process holds one device."""
        return self.world_size

    def samples_from_ranks(self, summed_over_ranks: int | float) -> float:
        """Samples that entered the model, from every rank's own count: a sequence group's ranks each
        see every sample of their group, a part of its tokens, so each sample is counted once."""
        return summed_over_ranks / self.sequence_parallel

    def summary_fields(self) -> dict[str, int]:
        return {
            "world_size": self.world_size,
            "data_parallel_size": self.data_parallel_size,
            "sequence_parallel_size": self.sequence_parallel,
        }

    @classmethod
    def from_environment(
        cls, world_size: int, sequence_parallel: int = 1, environ: Mapping[str, str] = os.environ
    ) -> ParallelLayout:
        """The layout of this launch: its processes, and the `--sequence_parallel` degree of the run.
        A profile's own `parallelism_config` (`PARALLELISM_CONFIG_*`, set by `accelerate launch`) is
        refused here, in one line, before anything loads: a run would otherwise count, plan and
        checkpoint as data parallel what is not; the sequence degree is a run flag, not a profile's."""
        if environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() in ("1", "true"):
            for dimension in ("DP_REPLICATE", "TP", "CP", "SP"):
                size = environ.get(f"{PARALLELISM_PREFIX}{dimension}_SIZE", "1")
                if size != "1":
                    raise FinetuneError(
                        f"the profile's parallelism_config sets {dimension.lower()}_size {size}: finetune "
                        "trains data parallel, sharded over every process (a sequence-parallel run takes "
                        "--sequence_parallel N); remove it from the profile"
                    )
        return cls(world_size, sequence_parallel)
