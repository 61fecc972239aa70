"""A quiet terminal: the libraries' known noise is filtered (finetune/quiet.py), and the output of a
2-rank ZeRO-3 run and of `finetune plan` stays within a stated number of lines."""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys

import pytest

from finetune.quiet import DEEPSPEED_OP_LOADED, without_printed_lines

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL

NOISE = (
    "Failed to load", "_pytree", "FutureWarning", "Setting accelerator to CPU", "OMP_NUM_THREADS",
    "strongly recommend passing in an `attention_mask`", "built successfully", "Writing model shards",
)  # fmt: skip
PLAN_LINES = 20  # the table of nine profiles, its header and the recommendation
ZERO3_RUN_LINES = 25  # the launch line, data notes, three step lines, eval, the end-of-run block


def output_of(*arguments: str, cwd=PROJECT_ROOT) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "finetune", *arguments], cwd=cwd, env=ENVIRONMENT, capture_output=True,
        text=True, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return (result.stdout + result.stderr).splitlines()


def assert_quiet(lines: list[str], budget: int) -> None:
    noisy = [line for line in lines if any(text in line for text in NOISE)]
    assert not noisy, noisy[:5]
    assert len(lines) <= budget, "\n".join(lines)


def test_plan_prints_its_table_and_nothing_else():
    assert_quiet(output_of("plan", "--model", "gpt2-medium", "--gpus", "4", "--gpu_memory", "80"), PLAN_LINES)


def test_generate_prints_no_library_banner(tiny_gpt2_dir):
    lines = output_of("generate", str(tiny_gpt2_dir), "--prompt", "the", "--max_new_tokens", "3")
    assert_quiet(lines, 4)  # the completion (it may hold a newline) and transformers' weight-loading bar


@pytest.mark.integration
def test_a_two_rank_zero3_run_stays_within_its_line_budget(tmp_path):
    lines = output_of(
        "run", "--profile", "zero3", "--num_processes", "2", *TINY_MODEL, "--max_steps", "20",
        "--block_size", "64", "--max_eval_samples", "8", "--disable_tqdm", "true", "--report_to", "none",
        "--output_dir", str(tmp_path / "out"),
    )  # fmt: skip
    assert_quiet(lines, ZERO3_RUN_LINES)
    [end] = [line for line in lines if line.startswith("finetune: completed in ")]
    assert "s of wall time" in end and "s of it start-up" in end


@pytest.mark.integration
def test_a_packed_instruction_run_has_no_padding_warning(tmp_path):
    """GSM8K packed: GPT-2's EOS, its pad token, ends every answer in the blocks."""
    lines = output_of(
        "run", "--profile", "single", "--model", "gpt2", "--from_scratch", "--config_overrides",
        "n_layer=1,n_embd=32,n_head=2", "--dataset", "gsm8k", "--max_steps", "2", "--block_size", "128",
        "--max_eval_samples", "4", "--disable_tqdm", "true", "--report_to", "none", "--output_dir",
        str(tmp_path / "out"),
    )  # fmt: skip
    assert not [line for line in lines if any(text in line for text in NOISE)]


def interrupted_while_importing(module: str, then: str) -> subprocess.CompletedProcess[str]:
    """Python running `then` with Ctrl-C arriving at the first use of `module` (while it imports)."""
    script = (
        "import sys, types\n"
        "class Interrupting(types.ModuleType):\n"
        "    def __getattr__(self, name):\n"
        "        raise KeyboardInterrupt\n"
        f"sys.modules[{module!r}] = Interrupting({module!r})\n"
        f"{then}\n"
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=120)  # fmt: skip


def test_ctrl_c_while_the_package_imports_is_one_line_and_exit_130():
    """The KeyboardInterrupt raised where the package imports torch (finetune.quiet)."""
    result = interrupted_while_importing("finetune.quiet", "import finetune")
    assert (result.returncode, result.stderr.strip()) == (130, "finetune: interrupted while starting")


def test_ctrl_c_while_the_command_line_module_imports_is_one_line_and_exit_130():
    """The KeyboardInterrupt raised while finetune.cli imports transformers and accelerate."""
    then = "from finetune.__main__ import console_main\nraise SystemExit(console_main())"
    result = interrupted_while_importing("finetune.cli", then)
    assert (result.returncode, result.stderr.strip()) == (130, "finetune: interrupted while starting")


def test_output_piped_into_a_reader_that_stops_early_ends_quietly():
    """`finetune plan ... | head`: the reader closes the pipe before the table is written (reading
    a line first would race the child's whole table into the pipe's buffer, and it would exit 0)."""
    command = [
        sys.executable,
        "-m",
        "finetune",
        "plan",
        "--model",
        "gpt2",
        "--gpu_memory",
        "80",
        "--gpus",
        "2",
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=PROJECT_ROOT,
                          env=ENVIRONMENT) as finetune:  # fmt: skip
        finetune.stdout.close()  # before the table is printed (imports take seconds): its writes must fail
        stderr = finetune.stderr.read().decode()
        code = finetune.wait(timeout=120)
    assert (code, stderr.strip()) == (141, "")


def test_resized_embeddings_leave_transformers_explanation_to_finetunes_own_line():
    resize = (
        "import finetune\n"
        "from transformers import GPT2Config, GPT2LMHeadModel\n"
        "model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=1, vocab_size=16))\n"
        "model.resize_token_embeddings(20, mean_resizing=True)\n"
    )
    result = subprocess.run([sys.executable, "-c", resize], capture_output=True, text=True, cwd=PROJECT_ROOT,
                            env=ENVIRONMENT, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "multivariate normal" not in result.stderr


def test_printed_lines_that_match_are_dropped_with_their_line_end_and_the_rest_pass_at_once():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), without_printed_lines(DEEPSPEED_OP_LOADED):
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        sys.stdout.write("progress 50%\r")
        assert out.getvalue() == "progress 50%\r"  # not held back until a line end
        print("DeepSpeed says something else")
    assert out.getvalue() == "progress 50%\rDeepSpeed says something else\n"


def test_dynamos_line_about_profiler_labels_in_compiled_regions_is_filtered_and_its_logger_kept(caplog):
    dynamo = logging.getLogger("torch._dynamo.variables.ctx_manager")
    with caplog.at_level(logging.WARNING):
        dynamo.warning("Profiler record function %s will be ignored", "<function FSDP::pre_forward>")
        dynamo.warning("something else dynamo says")
    assert caplog.messages == ["something else dynamo says"]
