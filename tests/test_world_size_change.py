"""`--resume --allow_world_size_change`: a checkpoint continued on another number of processes ends
where the uninterrupted run ends.

The uninterrupted run is the profile's 2-process reference run (tests/runs.py: global batch 8 = micro
batch 4 x 2 processes, a checkpoint every 5 steps). 2 -> 1: its first checkpoint is copied into a fresh
folder and resumed on 1 process (accumulation 2 keeps the global batch). 1 -> 2: a later checkpoint of
that 1-process run, written by 1 process, is copied into another folder and resumed on 2 processes
with the command a 1-process run is started with (accumulation 2). The model has no dropout, so the
resumed steps compute the same function on the same samples at the same learning rates: the step
losses and the final eval loss differ from the uninterrupted run's only by float32 rounding, since the
gradients of the global batch are summed in another order (accumulated on one process instead of
all-reduced over two). The first resumed step runs on the restored weights and batch, so its loss
is the one the run that saved the checkpoint logged for that step, to float32 rounding. After it,
Adam divides by the root of the squared gradients, so rounding in small gradients grows step by
step: under ddp the sums come out bit-equal (0 apart), under zero2 and fsdp within 2e-6 by step 20,
under zero3 (whose reduce-scatter sums in another order) 1e-5 after the first update and 2.1e-3 by
step 20 (eval loss 2.5e-3), measured on this suite's CPUs. LOSS_RTOL bounds each with room; a lost
optimizer state (Adam's first update moves every weight by the learning rate) or a halved global
batch moves the losses by more, and the learning rates are checked to be the same exactly.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from finetune.checkpoint import checkpoint_problem, checkpoints_newest_first
from finetune.errors import FinetuneError
from finetune.launched import BatchGeometry, Launch
from finetune.reshard import (
    checkpoint_geometry,
    continue_on_this_world_size,
    place_step_counters,
)
from finetune.summary import read_summary

from launching import accelerate_launch, launch
from runs import CHECKPOINT_STEPS, FLAGS, MAX_STEPS, copy_checkpoint

PROFILES = ["ddp", "zero2", "zero3", "fsdp"]
LOSS_RTOL = {"ddp": 1e-4, "zero2": 1e-4, "fsdp": 1e-4, "zero3": 5e-3}
FIRST_STEP_RTOL = 1e-6
# Both give the global batch 8 = micro batch 4 x accumulation x processes.
ACCUMULATION = {2: 1, 1: 2}
# The checkpoint each resume starts from, by the number of processes that saved it: the reference run's
# first, and one the 1-process run wrote after it had resumed.
RESUMED_FROM = {2: CHECKPOINT_STEPS[0], 1: CHECKPOINT_STEPS[1]}


def run(
    profile: str, processes: int, accumulation: int, output_dir: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    flags = [*FLAGS, "--gradient_accumulation_steps", str(accumulation), *extra]
    return launch(accelerate_launch(profile, processes), output_dir, flags)


def step_losses(output_dir: Path) -> dict[int, float]:
    state = json.loads((output_dir / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}


def learning_rates(output_dir: Path) -> dict[int, float]:
    state = json.loads((output_dir / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    return {entry["step"]: entry["learning_rate"] for entry in state["log_history"] if "loss" in entry}


@pytest.fixture(scope="module", params=PROFILES)
def profile(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def straight(profile, reference_run) -> Path:
    return reference_run(profile)


@pytest.fixture(scope="module")
def resumed_runs(profile, straight, tmp_path_factory) -> dict[int, tuple[Path, str]]:
    """The folder and the stderr of each resumed run, by the number of processes that saved its checkpoint.

    The reference's checkpoint is resumed on 1 process first, then one of that run's own checkpoints
    on 2 processes."""
    resumed = {}
    saved_in = {2: straight}
    for saved_on, resumed_on in ((2, 1), (1, 2)):
        output_dir = tmp_path_factory.mktemp(f"{profile}-{saved_on}-to-{resumed_on}")
        copy_checkpoint(saved_in[saved_on], output_dir, RESUMED_FROM[saved_on])
        # the command that started the run that saved it, launched on another number of processes
        flags = ("--resume", "--allow_world_size_change")
        result = run(profile, resumed_on, ACCUMULATION[saved_on], output_dir, *flags)
        resumed[saved_on] = output_dir, result.stderr
        saved_in[resumed_on] = output_dir
    return resumed


SAVED_ON = pytest.mark.parametrize("saved_on", [2, 1], ids=["2-to-1", "1-to-2"])


@pytest.mark.integration
@SAVED_ON
def test_resume_keeps_the_global_batch_by_changing_the_accumulation(resumed_runs, saved_on):
    _, stderr = resumed_runs[saved_on]
    resumed_on = 3 - saved_on
    assert (
        f"global batch 8 = micro batch 4 x accumulation {ACCUMULATION[resumed_on]} x {resumed_on} pro"
        in stderr
    )


@pytest.mark.integration
@SAVED_ON
def test_resume_continues_the_step_count_and_the_lr_schedule(resumed_runs, straight, saved_on):
    output_dir, _ = resumed_runs[saved_on]
    summary = read_summary(output_dir)
    assert (summary["resumed_from_step"], summary["steps"]) == (RESUMED_FROM[saved_on], MAX_STEPS)
    assert learning_rates(output_dir) == learning_rates(straight)


@pytest.mark.integration
@SAVED_ON
def test_resumed_steps_see_the_uninterrupted_runs_samples_and_end_at_its_loss(
    profile, resumed_runs, straight, saved_on
):
    output_dir, _ = resumed_runs[saved_on]
    resumed, expected = step_losses(output_dir), step_losses(straight)
    assert resumed.keys() == expected.keys()
    first = RESUMED_FROM[saved_on] + 1
    saver = straight if saved_on == 2 else resumed_runs[2][0]  # the run that wrote the checkpoint
    assert resumed[first] == pytest.approx(step_losses(saver)[first], rel=FIRST_STEP_RTOL)
    for step in range(first + 1, MAX_STEPS + 1):
        assert resumed[step] == pytest.approx(expected[step], rel=LOSS_RTOL[profile]), step
    assert read_summary(output_dir)["eval_loss"] == pytest.approx(
        read_summary(straight)["eval_loss"], rel=LOSS_RTOL[profile]
    )


@pytest.mark.integration
@SAVED_ON
def test_zero_checkpoints_are_converted_beside_the_original_and_outside_the_rotation(
    profile, resumed_runs, saved_on
):
    if not profile.startswith("zero"):
        pytest.skip("only DeepSpeed checkpoints are converted")
    output_dir, stderr = resumed_runs[saved_on]
    original = output_dir / f"checkpoint-{RESUMED_FROM[saved_on]}"
    universal = output_dir / f"universal-checkpoint-{RESUMED_FROM[saved_on]}"
    assert checkpoint_problem(original) is None  # every byte as written
    assert checkpoint_problem(universal) is None
    assert (universal / "latest_universal").is_file() and not (original / "latest_universal").exists()
    assert [path.name for path in checkpoints_newest_first(output_dir)] == [
        f"checkpoint-{step}" for step in reversed(CHECKPOINT_STEPS) if step >= RESUMED_FROM[saved_on]
    ]
    assert f"{universal} ({original.name} is unchanged; the copy is not rotated" in stderr


def test_accumulation_grows_when_processes_go_away():
    assert BatchGeometry(2, 1, 4).continued_on(1, 2) == BatchGeometry(2, 4, 1)


def test_accumulation_shrinks_when_processes_are_added():
    assert BatchGeometry(4, 4, 1).continued_on(2, 4) == BatchGeometry(4, 2, 2)


def test_processes_that_cannot_keep_the_global_batch_are_refused_with_the_ones_that_can():
    with pytest.raises(FinetuneError, match=r"global batch 4 .*cannot make 4 exactly: resume on 1 processes"):
        BatchGeometry(4, 1, 1).continued_on(2, 4)


def test_geometry_of_a_checkpoint_without_a_run_entry_comes_from_its_files(tmp_path):
    checkpoint = tmp_path / "checkpoint-5"
    checkpoint.mkdir()
    (checkpoint / "finetune_checkpoint.json").write_text('{"step": 5, "run_name": "r", "files": {}}')
    (checkpoint / "trainer_state.json").write_text('{"train_batch_size": 4}')
    for rank in range(3):
        (checkpoint / f"rng_state_{rank}.pth").touch()
    assert checkpoint_geometry(checkpoint, current_accumulation=2) == BatchGeometry(4, 2, 3)


class Wrapped:
    """accelerate's and DeepSpeed's optimizer wrappers keep the torch optimizer as `.optimizer`."""

    def __init__(self, optimizer: object) -> None:
        self.optimizer = optimizer


def optimizer_state(fused: bool, parameter: torch.Tensor, step: torch.Tensor) -> object:
    """The two attributes place_step_counters reads, as DeepSpeed's universal loader leaves them."""

    return SimpleNamespace(
        param_groups=[{"fused": fused, "capturable": False, "params": []}],
        state={parameter: {"step": step, "exp_avg": torch.zeros(2)}},
    )


def test_a_fused_adams_step_counters_loaded_on_the_cpu_move_beside_their_parameters():
    parameter = torch.empty(2, device="meta")
    inner = optimizer_state(True, parameter, torch.tensor(20.0))
    place_step_counters(Wrapped(Wrapped(inner)))
    assert inner.state[parameter]["step"].device == parameter.device


def test_an_unfused_adams_step_counters_stay_on_the_cpu():
    parameter = torch.empty(2, device="meta")
    inner = optimizer_state(False, parameter, torch.tensor(20.0))
    place_step_counters(Wrapped(inner))
    assert inner.state[parameter]["step"].device == torch.device("cpu")


def test_a_world_size_change_sets_the_accumulation_through_the_batch_geometry_rules(tmp_path, monkeypatch):
    """The accumulation it adds turns the profile's CUDA graphs off, as BatchGeometry.apply does for any."""
    checkpoint = tmp_path / "checkpoint-5"
    checkpoint.mkdir()
    run = {"world_size": 2, "micro_batch_size": 4, "gradient_accumulation_steps": 1}
    (checkpoint / "finetune_checkpoint.json").write_text(json.dumps({"step": 5, "run": run, "files": {}}))
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    args = SimpleNamespace(
        allow_world_size_change=True, world_size=1, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, process_index=0, torch_compile=True, torch_compile_mode=None,
        gradient_checkpointing=False, attention_kernel="sdpa", batch_flags_given=frozenset(),
    )  # fmt: skip
    assert continue_on_this_world_size(checkpoint, args, Launch.from_environment()) == checkpoint
    assert (args.gradient_accumulation_steps, args.torch_compile_mode) == (2, "default")
