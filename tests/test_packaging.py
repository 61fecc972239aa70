"""Installed like a package: the wheel carries the profiles, DeepSpeed JSON and recipes, and `finetune`
works from a folder outside the checkout; `finetune profiles --copy` gives a user an editable pair.

The integration tests build the wheel from a copy of the sources, install it (without dependencies:
the current environment has them) into a folder of its own and run it with that folder on
PYTHONPATH from a temporary working directory, so neither the checkout nor its editable install can
answer for it.
"""

import ast
import configparser
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.errors import FinetuneError
from finetune.profiles import PROFILES_DIR, load_profile

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT

SOURCES = (
    "setup.cfg",
    "pyproject.toml",
    "README.md",
    "finetune",
    "accelerate_configs",
    "ds_configs",
    "recipes",
)
TIMEOUT_S = 300


def imported_top_level_modules() -> set[str]:
    modules = set()
    for path in (PROJECT_ROOT / "finetune").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"finetune"}


def declared_distributions() -> set[str]:
    """install_requires and every extra's names, normalised as pip compares them."""
    config = configparser.ConfigParser()
    config.read(PROJECT_ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    lines += [line for extra in config["options.extras_require"].values() for line in extra.splitlines()]
    names = {re.split(r"[<>=!~\[; ]", line.strip())[0] for line in lines if line.strip()}
    return {re.sub(r"[-_.]+", "-", name).lower() for name in names}


def test_every_imported_module_is_a_declared_dependency():
    """A module that comes only as another package's dependency disappears when that package drops it
    (httpx went with huggingface_hub 2), and every command then fails on import."""
    providers = importlib.metadata.packages_distributions()
    declared = declared_distributions()
    undeclared = {
        module: providers.get(module)
        for module in imported_top_level_modules()
        if not {re.sub(r"[-_.]+", "-", name).lower() for name in providers.get(module, [])} & declared
    }
    assert not undeclared, f"imported but not declared in setup.cfg: {undeclared}"


def test_profiles_copy_writes_the_yaml_and_the_json_it_names(capsys):
    assert main(["profiles", "--copy", "zero3", "mine"]) == 0
    assert sorted(path.name for path in Path("mine").iterdir()) == ["zero3.json", "zero3.yaml"]
    copy = load_profile("mine/zero3.yaml")
    assert copy.deepspeed_config_path == Path("mine/zero3.json").resolve()
    assert "finetune run --profile mine/zero3.yaml" in capsys.readouterr().out


def test_an_edited_copy_is_what_the_profile_reads():
    main(["profiles", "--copy", "zero3", "mine"])
    config = json.loads(Path("mine/zero3.json").read_text())
    config["zero_optimization"]["stage"] = 2
    Path("mine/zero3.json").write_text(json.dumps(config))
    assert load_profile("mine/zero3.yaml").deepspeed_config["zero_optimization"]["stage"] == 2


def test_a_copy_finds_its_own_json_from_any_working_directory(monkeypatch, tmp_path):
    main(["profiles", "--copy", "zero3", "mine"])
    monkeypatch.chdir(tmp_path.parent)
    assert load_profile(tmp_path / "mine/zero3.yaml").deepspeed_config_path == tmp_path / "mine/zero3.json"


def copied_layout(root: Path, stage: int) -> Path:
    """accelerate_configs/zero3.yaml and ds_configs/zero3.json copied by hand, the JSON edited."""
    (root / "accelerate_configs").mkdir(parents=True)
    (root / "ds_configs").mkdir()
    shipped = load_profile("zero3")
    yaml_copy = root / "accelerate_configs/zero3.yaml"
    yaml_copy.write_text(shipped.path.read_text())
    config = json.loads(shipped.deepspeed_config_path.read_text())
    config["zero_optimization"]["stage"] = stage
    (root / "ds_configs/zero3.json").write_text(json.dumps(config))
    return yaml_copy


def test_a_copied_layout_reads_its_own_edited_json_not_the_shipped_one(tmp_path):
    profile = load_profile(copied_layout(tmp_path / "project", stage=2))
    assert profile.deepspeed_config_path == tmp_path / "project/ds_configs/zero3.json"
    assert profile.deepspeed_config["zero_optimization"]["stage"] == 2


def test_a_json_from_the_working_directory_differing_from_the_one_beside_the_profile_is_refused(tmp_path):
    copied_layout(tmp_path, stage=1)
    with pytest.raises(FinetuneError, match=r"from the working directory.*beside the profile.*differ"):
        load_profile(copied_layout(tmp_path / "project", stage=2))


def test_a_shipped_profile_takes_an_edited_json_of_its_name_from_the_working_directory(tmp_path):
    """As `accelerate launch --config_file` of the shipped YAML would read it from here."""
    copied_layout(tmp_path, stage=2)
    profile = load_profile("zero3")
    assert profile.deepspeed_config_path == tmp_path / "ds_configs/zero3.json"
    assert profile.deepspeed_config["zero_optimization"]["stage"] == 2


def test_a_yaml_copied_alone_reads_the_shipped_json(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/zero3.yaml").write_text(load_profile("zero3").path.read_text())
    shipped_json = load_profile("zero3").deepspeed_config_path
    assert load_profile("mine/zero3.yaml").deepspeed_config_path == shipped_json


def test_a_copy_keeps_the_profiles_comments():
    main(["profiles", "--copy", "zero3", "mine"])
    assert load_profile("mine/zero3.yaml").description == load_profile("zero3").description


def test_profiles_copy_of_a_profile_without_deepspeed_writes_its_yaml_only():
    main(["profiles", "--copy", "ddp", "mine"])
    assert [path.name for path in Path("mine").iterdir()] == ["ddp.yaml"]
    assert load_profile("mine/ddp.yaml").settings == load_profile("ddp").settings


def test_profiles_copy_refuses_to_overwrite_in_one_line(capsys):
    main(["profiles", "--copy", "zero2", "mine"])
    Path("mine/zero2.json").write_text("{}")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["profiles", "--copy", "zero2", "mine"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("finetune: error: ") and "already exist" in error[0]
    assert Path("mine/zero2.json").read_text() == "{}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """The wheel built from the sources and installed into a folder; a working directory beside it."""
    root = tmp_path_factory.mktemp("packaging")
    sources = root / "sources"
    sources.mkdir()
    for name in SOURCES:
        source = PROJECT_ROOT / name
        if source.is_dir():
            shutil.copytree(source, sources / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, sources / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", str(sources), "-w", str(root / "dist")]
    subprocess.run(build, cwd=root, check=True, capture_output=True, timeout=TIMEOUT_S)
    wheels = list((root / "dist").glob("finetune-*.whl"))
    install = [*pip, "install", "--no-deps", "--target", str(root / "site"), *map(str, wheels)]
    subprocess.run(install, cwd=root, check=True, capture_output=True, timeout=TIMEOUT_S)
    work = root / "work"
    work.mkdir()
    return {"site": root / "site", "work": work}


def finetune(installed: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed `finetune` console script, run from the working directory outside the checkout."""
    environment = {**ENVIRONMENT, "PYTHONPATH": str(installed["site"])}
    command = [str(installed["site"] / "bin" / "finetune"), *args]
    return subprocess.run(command, cwd=installed["work"], env=environment, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S)  # fmt: skip


@pytest.mark.integration
def test_the_wheel_holds_every_module_of_the_package(installed):
    """A subpackage setup.cfg does not list would be missing from every user's install (the checkout's
    editable install hides that from the other tests: its finder supplies the missing module)."""
    package = PROJECT_ROOT / "finetune"
    in_checkout = {path.relative_to(package).as_posix() for path in package.rglob("*.py")}
    in_wheel = {
        path.relative_to(installed["site"] / "finetune").as_posix()
        for path in (installed["site"] / "finetune").rglob("*.py")
    }
    assert sorted(in_checkout - in_wheel) == []


@pytest.mark.integration
def test_the_installed_package_is_imported_not_the_checkout(installed):
    environment = {**ENVIRONMENT, "PYTHONPATH": str(installed["site"])}
    command = [
        sys.executable,
        "-c",
        "import finetune.profiles as p; print(p.__file__); print(p.PROFILES_DIR)",
    ]
    result = subprocess.run(command, cwd=installed["work"], env=environment, capture_output=True, text=True,
                            timeout=TIMEOUT_S, check=True)  # fmt: skip
    module, profiles = (Path(line) for line in result.stdout.split())
    assert installed["site"] in module.parents and installed["site"] in profiles.parents


@pytest.mark.integration
def test_installed_finetune_profiles_lists_every_profile(installed):
    result = finetune(installed, "profiles")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines()]
    assert sorted(listed) == sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))
    assert len(listed) == 10


@pytest.mark.integration
def test_installed_profiles_copy_gives_a_pair_that_validates(installed):
    result = finetune(installed, "profiles", "--copy", "zero3_nvme", "my_profiles")
    assert result.returncode == 0, result.stderr
    checked = finetune(installed, "profiles", "my_profiles/zero3_nvme.yaml")
    assert checked.returncode == 0, checked.stderr
    assert (installed["work"] / "my_profiles" / "zero3_nvme.json").is_file()


@pytest.mark.integration
def test_installed_two_rank_zero2_run_of_the_shipped_quick_start_recipe_trains(installed):
    output_dir = installed["work"] / "run"
    flags = ["--max_steps", "2", "--max_eval_samples", "4", "--output_dir", str(output_dir)]
    recipe = "recipes/cpu_quickstart.yaml"
    result = finetune(installed, "run", "--profile", "zero2", "--num_processes", "2", recipe, *flags)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "using the shipped recipe" in result.stderr
    summary = json.loads((output_dir / "run_summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["strategy"] == "zero2" and summary["world_size"] == 2


@pytest.mark.integration
def test_installed_slurm_script_names_no_checkout_path(installed):
    result = finetune(installed, "slurm", "--profile", "zero3", "--nodes", "2", "--gpus_per_node", "4",
                      "--model", "gpt2")  # fmt: skip
    assert result.returncode == 0, result.stderr
    script = (installed["work"] / "finetune.sbatch").read_text()
    assert not [line for line in script.splitlines() if line.startswith("cd ")]
    assert str(PROJECT_ROOT / "finetune") not in script and "accelerate_configs" not in script
    assert "--profile zero3" in script
