"""`finetune` command line: profiles, run, export, eval, generate.

`run` launches finetune/run.py under a profile; the others work on what a run leaves behind.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from finetune.errors import FinetuneError, exit_on_user_error
from finetune.profiles import Profile, available_profiles, load_profile

RUN_SCRIPT = Path(__file__).resolve().parent / "run.py"
LAUNCH_OPTIONS = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")


def profiles_command(args: argparse.Namespace) -> int:
    """Print every profile with its description; a broken one prints its error and fails the command."""
    failures = 0
    paths = [Path(p) for p in args.files] if args.files else available_profiles()
    for path in paths:
        try:
            profile = load_profile(path)
        except FinetuneError as error:
            failures += 1
            print(f"finetune: error: {error}", file=sys.stderr)
            continue
        print(f"{profile.name:<15} {profile.description}")
    return 1 if failures else 0


def resolved_profile_file(profile: Profile, folder: Path) -> Path:
    """A copy of the profile with an absolute DeepSpeed JSON path, so runs work from any directory."""
    settings = dict(profile.settings)
    if profile.deepspeed_config_path is not None:
        settings["deepspeed_config"] = {
            **settings["deepspeed_config"],
            "deepspeed_config_file": str(profile.deepspeed_config_path),
        }
    path = folder / f"{profile.name}.yaml"
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return path


def default_num_processes() -> int:
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise FinetuneError("no GPU is visible: pass --num_processes N to run N CPU processes (gloo)")
    return gpus


def launch_command(
    profile: Profile, config_file: Path, options: argparse.Namespace, run_args: list[str]
) -> list[str]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file)]
    if profile.multi_process:
        if options.num_processes is None:
            options.num_processes = default_num_processes()
        for name in LAUNCH_OPTIONS:
            value = getattr(options, name)
            if value is not None:
                command += [f"--{name}", str(value)]
    return [*command, str(RUN_SCRIPT), *run_args]


def run_command(options: argparse.Namespace, run_args: list[str]) -> int:
    profile = load_profile(options.profile)
    with tempfile.TemporaryDirectory(prefix="finetune-profile-") as folder:
        command = launch_command(profile, resolved_profile_file(profile, Path(folder)), options, run_args)
        print("finetune: " + " ".join(command), file=sys.stderr)
        environment = {**os.environ, "FINETUNE_PROFILE": profile.name}
        return subprocess.call(command, env=environment)


def export_command(options: argparse.Namespace) -> int:
    from finetune.checkpoint import allow_checkpoint_classes
    from finetune.export import export_checkpoint

    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    allow_checkpoint_classes()
    folder = export_checkpoint(options.checkpoint, options.output_dir, options.dtype)
    print(f"finetune: exported {options.checkpoint} to {folder} ({options.dtype})")
    return 0


def eval_command(options: argparse.Namespace) -> int:
    from finetune.arguments import DataArguments
    from finetune.evaluation import evaluate_saved_model

    data_args = DataArguments(dataset=options.dataset, text_column=options.text_column)
    result = evaluate_saved_model(
        options.model,
        data_args,
        options.split,
        options.block_size,
        options.stride,
        options.batch_size,
        options.max_tokens,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result))
        if options.output:
            Path(options.output).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def generate_command(options: argparse.Namespace) -> int:
    from finetune.generate import Sampling, generate, read_prompts

    prompts = read_prompts(options.prompt, options.prompts_file)
    sampling = Sampling(
        max_new_tokens=options.max_new_tokens,
        temperature=options.temperature,
        top_k=options.top_k,
        top_p=options.top_p,
        greedy=options.greedy,
        seed=options.seed,
    )
    for prompt, completion in zip(prompts, generate(options.model, prompts, sampling), strict=True):
        print(f"{prompt}{completion}")
    return 0


def add_export_parser(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export", help="write a checkpoint of any profile as a plain Hugging Face model folder"
    )
    export.add_argument("checkpoint", help="a checkpoint-N folder (DDP, FSDP or DeepSpeed ZeRO)")
    export.add_argument("output_dir", help="folder for config.json, tokenizer and model.safetensors")
    export.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="weights dtype")


def add_eval_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "eval", help="perplexity of a saved model on a dataset split (sliding window)"
    )
    evaluate.add_argument("model", help="a model folder (a run's output_dir, an export) or a name")
    evaluate.add_argument("--dataset", default="wikitext-2-raw-v1", help="as finetune/run.py --dataset")
    evaluate.add_argument("--text_column", default="text", help="column that holds the text")
    evaluate.add_argument("--split", default="validation", choices=["train", "validation", "test"])
    evaluate.add_argument("--block_size", type=int, help="window length (default: the model's context)")
    evaluate.add_argument("--stride", type=int, help="window step (default: the block size, no overlap)")
    evaluate.add_argument("--batch_size", type=int, default=8, help="windows per forward")
    evaluate.add_argument("--max_tokens", type=int, help="evaluate only the split's first N tokens")
    evaluate.add_argument("--output", help="also write the result to this JSON file")


def add_generate_parser(commands: argparse._SubParsersAction) -> None:
    generation = commands.add_parser("generate", help="complete prompts with a saved model")
    generation.add_argument("model", help="a model folder (a run's output_dir, an export) or a name")
    generation.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for more)")
    generation.add_argument("--prompts_file", help="a file of prompts, one per line")
    generation.add_argument("--max_new_tokens", type=int, default=50)
    generation.add_argument("--temperature", type=float, default=1.0)
    generation.add_argument("--top_k", type=int, default=50)
    generation.add_argument("--top_p", type=float, default=1.0)
    generation.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    generation.add_argument("--seed", type=int, default=42, help="sampling seed (same seed, same text)")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    profiles = commands.add_parser("profiles", help="list the strategy profiles and validate them")
    profiles.add_argument(
        "files", nargs="*", help="profile YAML files to check (default: accelerate_configs/*.yaml)"
    )

    run = commands.add_parser(
        "run",
        help="launch finetune/run.py under a profile with accelerate launch",
        description="Any flag not listed here goes to finetune/run.py (see `python finetune/run.py --help`).",
    )
    run.add_argument("--profile", required=True, help="profile name (see `finetune profiles`) or YAML file")
    run.add_argument("--num_processes", type=int, help="processes in all (default: every visible GPU)")
    run.add_argument("--num_machines", type=int, help="machines (nodes) taking part")
    run.add_argument("--machine_rank", type=int, help="this machine's rank among them")
    run.add_argument("--main_process_ip", help="address of machine rank 0")
    run.add_argument("--main_process_port", type=int, help="port on machine rank 0")
    add_export_parser(commands)
    add_eval_parser(commands)
    add_generate_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    options, rest = parser.parse_known_args(argv)
    if rest and options.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    commands = {
        "profiles": profiles_command,
        "export": export_command,
        "eval": eval_command,
        "generate": generate_command,
    }
    with exit_on_user_error():
        if options.command == "run":
            return run_command(options, rest)
        return commands[options.command](options)
    return 0
