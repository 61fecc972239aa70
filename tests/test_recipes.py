"""Recipes: each shipped recipe is run flags the real parser takes, headed by a launch line that parses.

A recipe's first line is the command that runs it; `finetune run` finds the shipped recipe by file name
where the path given does not exist (outside a checkout).
"""

import json
import shlex
from pathlib import Path

import pytest

from finetune.arguments import expand_recipe, parse_arguments
from finetune.cli import make_parser
from finetune.errors import FinetuneError
from finetune.profiles import RECIPES_DIR, load_profile, with_shipped_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def launch_line(recipe: Path) -> list[str]:
    first = recipe.read_text().splitlines()[0]
    assert first.startswith("# finetune "), f"{recipe.name}: the first line is not `# finetune ...`"
    return shlex.split(first.removeprefix("# "))


def test_the_common_jobs_have_recipes():
    assert {"cpu_quickstart", "gpt2_medium_wikitext2", "speed_one_gpu"} <= {path.stem for path in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_every_recipe_parses_with_the_run_parser(recipe):
    model_args, _, training_args = parse_arguments(expand_recipe([str(recipe)]))
    assert model_args.model
    assert training_args.output_dir.startswith("outputs/")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_every_recipe_is_headed_by_a_launch_line_that_runs_it(recipe):
    options, run_args = make_parser().parse_known_args(launch_line(recipe)[1:])
    assert options.command == "run"
    load_profile(options.profile)
    assert run_args[0] == f"recipes/{recipe.name}"
    parse_arguments(expand_recipe([str(ROOT / run_args[0]), *run_args[1:]]))


def test_a_recipe_path_that_does_not_exist_here_is_the_shipped_recipe_of_that_name(capsys):
    assert with_shipped_recipe(["recipes/cpu_quickstart.yaml", "--max_steps", "2"]) == [
        str(RECIPES_DIR / "cpu_quickstart.yaml"),
        "--max_steps",
        "2",
    ]
    assert "using the shipped recipe" in capsys.readouterr().err


def test_a_recipe_file_that_exists_here_is_used_as_it_is(tmp_path):
    own = tmp_path / "recipes" / "cpu_quickstart.yaml"
    own.parent.mkdir()
    own.write_text("max_steps: 1\n")
    assert with_shipped_recipe(["recipes/cpu_quickstart.yaml"]) == ["recipes/cpu_quickstart.yaml"]


def test_an_unknown_recipe_name_is_left_for_the_run_parser_to_report():
    assert with_shipped_recipe(["no_such_recipe.yaml"]) == ["no_such_recipe.yaml"]


def test_a_recipe_list_for_a_list_flag_gives_each_item_as_one_value_commas_kept(tmp_path):
    recipe = tmp_path / "prompts.yaml"
    recipe.write_text('generation_prompt: [Once upon a time, "Apples, pears and"]\n')
    _, _, training_args = parse_arguments([str(recipe), "--output_dir", str(tmp_path / "out")])
    assert training_args.generation_prompt == ["Once upon a time", "Apples, pears and"]


def test_a_recipe_list_for_a_comma_separated_flag_is_joined_with_commas(tmp_path):
    recipe = tmp_path / "targets.yaml"
    recipe.write_text("peft: lora\nlora_target_modules: [q_proj, v_proj]\n")
    model_args, _, _ = parse_arguments([str(recipe), "--output_dir", str(tmp_path / "out")])
    assert model_args.lora_target_modules == "q_proj,v_proj"


def test_a_recipe_list_for_a_single_valued_flag_is_refused_in_one_line(tmp_path):
    recipe = tmp_path / "two_models.yaml"
    recipe.write_text("model: [gpt2, distilgpt2]\n")
    with pytest.raises(FinetuneError, match=r"two_models.yaml: model takes one value, not a list: \['gpt2'"):
        parse_arguments([str(recipe), "--output_dir", str(tmp_path / "out")])


def test_a_recipe_list_for_report_to_names_each_integration(tmp_path):
    recipe = tmp_path / "reports.yaml"
    recipe.write_text("report_to: [tensorboard]\n")
    _, _, training_args = parse_arguments([str(recipe), "--output_dir", str(tmp_path / "out")])
    assert training_args.report_to == ["tensorboard"]


def test_a_recipe_mapping_for_a_key_value_flag_becomes_its_k_equals_v_list(tmp_path):
    recipe = tmp_path / "small.yaml"
    recipe.write_text("config_overrides: {n_layer: 2, n_embd: 64}\noptim_args:\n  foreach: false\n")
    model_args, _, training_args = parse_arguments([str(recipe), "--output_dir", str(tmp_path / "out")])
    assert model_args.config_overrides == "n_layer=2,n_embd=64"
    assert training_args.optim_args == "foreach=False"


def test_a_recipe_mapping_for_a_dict_flag_goes_as_json(tmp_path):
    recipe = tmp_path / "schedule.yaml"
    recipe.write_text("lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr: 1.0e-6}\n")
    _, _, training_args = parse_arguments([str(recipe), "--output_dir", str(tmp_path / "out")])
    assert json.loads(training_args.lr_scheduler_kwargs) == {"min_lr": 1e-6}  # TrainingArguments reads it
