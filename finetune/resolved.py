"""One resolved run: the flags parsed, the launch read, and every choice that depends on the launch
made, in the one function that run.py and `finetune doctor` both call.

The launch decides the precision of `--precision auto`, the compile default, the FSDP units and, with
`--global_batch_size`, the micro batch and accumulation. Resolved here once, doctor plans and checks
the run that would train (its micro batch, its dtype) instead of the flags' defaults. Nothing here
touches a device: the process that trains sets its devices up afterwards
(`launch_settings.set_up_devices`).
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.arguments import FinetuneTrainingArguments, parse_arguments
from finetune.launch_settings import resolve_launch_settings
from finetune.launched import BatchGeometry, Launch, mixed_precision
from finetune.planner import apply_global_batch
from finetune.run_flags import DataArguments, ModelArguments


@dataclass(frozen=True)
class ResolvedRun:
    model_args: ModelArguments
    data_args: DataArguments
    training_args: FinetuneTrainingArguments
    launch: Launch

    @property
    def geometry(self) -> BatchGeometry:
        return BatchGeometry.of(self.training_args, self.launch.data_parallel_size)

    @property
    def dtype(self) -> str:
        """The training precision as the summary and the planner name it."""
        return mixed_precision(self.training_args)

    def describe(self) -> str:
        """The run in a few words: what doctor says it checked."""
        geometry = self.geometry
        compiled = "compiled" if self.training_args.torch_compile else "eager"
        return (
            f"{self.launch.strategy.name} on {self.launch.world_size} process(es), micro batch "
            f"{geometry.micro} x {geometry.accumulation} (global {geometry.global_batch}), {self.dtype}, "
            f"{compiled}"
        )


def resolve_run(argv: list[str] | None) -> ResolvedRun:
    model_args, data_args, training_args = parse_arguments(argv)
    launch = Launch.from_environment(training_args.sequence_parallel)
    resolve_launch_settings(training_args, launch)
    apply_global_batch(model_args, data_args, training_args, launch)
    return ResolvedRun(model_args, data_args, training_args, launch)
