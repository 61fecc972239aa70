"""Shared fixtures for the unit tests.

The unit tests run offline, on CPU, in seconds. They use only the files in the shared data folder
(`../shared/data` next to the repository: GPT-2 configs and tokenizers without weights, the WikiText-2
validation/test files, Tiny Shakespeare) and what they write under pytest's temporary folders:

- `data_dir` is that shared folder; an autouse fixture points `$FINETUNE_DATA_DIR` at it and turns
  the Hub off, so name resolution finds local folders and a missing name can never fall through to
  a download.
- `gpt2_tokenizer` is the real GPT-2 tokenizer, loaded once; `tokenizer` a fresh one with a pad token,
  for tests whose code changes it (a chat template).
- `tiny_gpt2_dir` is a 2-layer GPT-2 with real (random) weights saved by `save_pretrained`: the
  shared folders have no weights, and loading weights is a path the package must test.
- `make_text_file` / `make_jsonl_file` write small local datasets for one test.
- `output_flags` (`--output_dir` under tmp_path, `--report_to none`) is what every test that builds
  TrainingArguments passes, so no test writes into the repository or starts a logger.
- `reference_run(profile)` is the folder of that profile's finished 2-rank run (tests/runs.py), launched
  on first use and shared by every module for the session: read it, copy from it, never write into it.
- `in_process_commands` undoes what `finetune.run.main` and `finetune.cli.main` install process-wide,
  for tests that call them in the pytest process instead of launching one; the autouse
  `transformers_packed_example_probe` gives every test transformers' own, whatever a run installed.
"""

import json
import os
import shutil
from pathlib import Path

# A FINETUNE_DATA_DIR set outside wins (the GPU machine's staged copy lies elsewhere); else ../shared/data.
SHARED_DATA_DIR = Path(
    os.environ.get("FINETUNE_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data"
).resolve()  # absolute: every test runs in its own working directory

# huggingface_hub, datasets and transformers read HF_HUB_OFFLINE when they are imported, so it must be
# set before any test module imports them. FINETUNE_DATA_DIR gets a session-wide default too, for
# module-scoped fixtures and subprocesses, which run outside the function-scoped autouse fixture below
# (that fixture re-asserts both for every test).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["FINETUNE_DATA_DIR"] = str(SHARED_DATA_DIR)
# The tests' own loads of saved models (a user's plain `from_pretrained`) keep the model's layers: from
# transformers 5.25 on, that call fetches kernels from the Hub unless told not to, and the suite is
# offline. The package's loads say so themselves (finetune.models.OWN_LAYERS, tested in test_models).
os.environ["USE_HUB_KERNELS"] = "0"
# pytest-xdist runs as many workers as the machine has cores (pyproject's addopts), and torch gives each
# worker a thread per core: the cores are oversubscribed, and OpenMP's threads spin waiting for each
# other, so a test that trains in its worker ran several times slower beside another worker than alone.
# Each worker gets its share of the cores, set before torch is imported (launched runs get one thread a
# rank from tests/launching.py). Only in a worker: the workers inherit the controlling process's variables.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    WORKERS = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))

import pytest  # noqa: E402
from huggingface_hub import constants as hub_constants  # noqa: E402
from transformers import masking_utils  # noqa: E402

from launching import undo_what_commands_install  # noqa: E402

# transformers' packed-example probe as imported: a run called in this process (run.main, in a test or
# a module's fixture) answers it for the whole process (finetune.packing)
TRANSFORMERS_PACKED_EXAMPLE_PROBE = masking_utils.find_packed_sequence_indices

# Set by `accelerate launch`; a leftover value would change how TrainingArguments are built.
LAUNCH_VARIABLES = (
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "ACCELERATE_USE_FSDP",
    "FSDP_VERSION",
    "FSDP_OFFLOAD_PARAMS",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
)


@pytest.fixture(scope="session")
def data_dir():
    return SHARED_DATA_DIR


@pytest.fixture(autouse=True)
def offline_environment(monkeypatch, data_dir, tmp_path):
    """Every test: data dir set, Hub off, no launcher variables, and a private working directory.

    The working directory matters because a name such as `gpt2` is first looked up as a local path.
    """
    monkeypatch.setenv("FINETUNE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def transformers_packed_example_probe(monkeypatch):
    """Every test gets transformers' own probe, whatever an in-process run before it installed."""
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", TRANSFORMERS_PACKED_EXAMPLE_PROBE)


@pytest.fixture
def trainer_events(tmp_path):
    """(args, state, control) as the Trainer passes them to every callback event."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    return args, TrainerState(), TrainerControl()


@pytest.fixture
def output_flags(tmp_path):
    """The flags every test that builds TrainingArguments passes: a private output folder, no loggers."""
    return ["--output_dir", str(tmp_path / "out"), "--report_to", "none"]


@pytest.fixture(scope="session")
def gpt2_tokenizer(data_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(data_dir / "gpt2")


@pytest.fixture
def tokenizer(data_dir):
    """A fresh GPT-2 tokenizer with a pad token, for tests whose code sets its chat template."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(data_dir / "gpt2")
    loaded.pad_token = loaded.eos_token
    return loaded


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory, gpt2_tokenizer):
    """A save_pretrained folder (safetensors weights, config, tokenizer) of a 2-layer GPT-2."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    folder = tmp_path_factory.mktemp("tiny-gpt2")
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=128, vocab_size=50257)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)  # transformers 5 always writes model.safetensors
    gpt2_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_config_dir(tmp_path_factory, gpt2_tokenizer):
    """A 2-layer Llama (RoPE, 2 heads) as config and GPT-2's tokenizer, for --from_scratch runs."""
    from tiny_configs import tiny_config

    folder = tmp_path_factory.mktemp("tiny-llama")
    special = {"bos_token_id": gpt2_tokenizer.bos_token_id, "eos_token_id": gpt2_tokenizer.eos_token_id}
    tiny_config(
        "llama", vocab_size=len(gpt2_tokenizer), max_position_embeddings=512, **special
    ).save_pretrained(folder)
    gpt2_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def byte_llama_config_dir(tmp_path_factory):
    """The same Llama with the launched tests' byte-level tokenizer (tests/data/README.md): runs that
    train it spend their steps on the blocks, not on GPT-2's 50,257-way output layer."""
    from tiny_configs import tiny_config
    from transformers import AutoTokenizer

    from launching import BYTE_GPT2

    tokenizer = AutoTokenizer.from_pretrained(BYTE_GPT2)
    folder = tmp_path_factory.mktemp("byte-llama")
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    tiny_config("llama", vocab_size=len(tokenizer), max_position_embeddings=1024, **special).save_pretrained(
        folder
    )
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """reference_run(profile) -> output_dir of the profile's reference run, launched when first asked for.

    Under pytest-xdist every worker has its own session: the runs go into the folder the workers'
    temporary folders share, and a lock per profile makes the first worker that asks launch it while
    the others wait for it, so each is launched once per test session however many workers ask.
    """
    from filelock import FileLock

    from runs import make_reference_run

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "reference-runs"
    root.mkdir(exist_ok=True)

    def get(profile: str) -> Path:
        folder, finished = root / profile, root / f"{profile}.finished"
        with FileLock(root / f"{profile}.lock"):
            if not finished.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a run that failed for another worker
                make_reference_run(profile, folder)
                finished.touch()
        return folder

    return get


@pytest.fixture
def in_process_commands(monkeypatch):
    """What a command run in this test installs process-wide stays in this test."""
    undo_what_commands_install(monkeypatch)


@pytest.fixture
def make_text_file(tmp_path):
    """make_text_file(name, text) -> Path of a text file under this test's tmp_path."""

    def make(name, text):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return make


@pytest.fixture
def make_jsonl_file(make_text_file):
    """make_jsonl_file(name, rows) -> Path of a JSON-lines file, one dict per row."""

    def make(name, rows):
        return make_text_file(name, "".join(json.dumps(row) + "\n" for row in rows))

    return make
