"""The project's Trainer: what it changes about the Trainer's data loading and the norms it reads."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from datasets import Dataset
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM, GPT2Config, TrainingArguments

from finetune.launched import CompilePlan
from finetune.profiles import load_strategy
from finetune.trainer import FinetuneTrainer


@pytest.fixture
def trainer_for(tmp_path):
    def build(torch_compile: bool, compile_plan: CompilePlan | None = None) -> FinetuneTrainer:
        model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
        blocks = Dataset.from_dict({"input_ids": [[1, 2, 3, 4]] * 10, "labels": [[1, 2, 3, 4]] * 10})
        args = TrainingArguments(
            output_dir=str(tmp_path),
            report_to="none",
            use_cpu=True,
            per_device_train_batch_size=4,
            per_device_eval_batch_size=4,
        )
        args.torch_compile = torch_compile  # set after __post_init__: compiling itself is not under test
        args.torch_compile_backend = "eager"  # where a test does compile: dynamo, without code generation
        return FinetuneTrainer(
            model=model, args=args, train_dataset=blocks, eval_dataset=blocks, compile_plan=compile_plan
        )

    return build


def test_a_compiled_model_trains_on_full_batches_only(trainer_for):
    trainer = trainer_for(torch_compile=True)
    assert [len(b["input_ids"]) for b in trainer.get_train_dataloader()] == [4, 4]


def test_an_eager_model_trains_on_every_sample(trainer_for):
    assert [len(b["input_ids"]) for b in trainer_for(torch_compile=False).get_train_dataloader()] == [4, 4, 2]


def test_evaluation_keeps_every_sample_when_compiled(trainer_for):
    trainer = trainer_for(torch_compile=True)
    assert sum(len(b["input_ids"]) for b in trainer.get_eval_dataloader()) == 10
    assert trainer.args.dataloader_drop_last is False
    assert torch.is_tensor(next(iter(trainer.get_eval_dataloader()))["input_ids"])


@pytest.mark.parametrize("scope", ["per_block", "whole"])
def test_evaluation_after_training_runs_the_model_accelerate_compiled(trainer_for, scope):
    """accelerate compiles a copy of the model (a block-by-block copy, or torch.compile's wrapper);
    the Trainer alone would evaluate the eager original."""
    trainer = trainer_for(torch_compile=True, compile_plan=CompilePlan(scope, "default"))
    trainer.args.max_steps = 1
    trainer.train()
    assert trainer.model_wrapped is not trainer.model
    evaluated = []
    prediction_step = trainer.prediction_step
    trainer.prediction_step = lambda model, *args, **kwargs: (
        evaluated.append(model) or prediction_step(model, *args, **kwargs)
    )
    trainer.evaluate()
    assert evaluated and all(model is trainer.model_wrapped for model in evaluated)


def test_evaluation_runs_the_eager_original_where_the_compiled_model_records_cuda_graphs(trainer_for):
    """Graphs recorded for evaluation's batch sizes held more than the eager forward."""
    trainer = trainer_for(torch_compile=True, compile_plan=CompilePlan("per_block", "reduce-overhead"))
    trainer.model_wrapped = torch.compile(trainer.model)
    assert trainer._wrap_model(trainer.model, training=False) is trainer.model


@pytest.mark.parametrize(
    ("scope", "mode", "profile", "compiled"),
    [("per_block", "default", "single", True), ("per_block", "reduce-overhead", "single", False),
     ("per_block", "reduce-overhead", "zero2", True), ("none", None, "fsdp", False)],
)  # fmt: skip
def test_the_summary_says_whether_evaluation_ran_compiled_code(trainer_for, scope, mode, profile, compiled):
    """FSDP2 and DeepSpeed compile the model in place: their evaluation runs what they compiled."""
    trainer = trainer_for(torch_compile=True, compile_plan=CompilePlan(scope, mode))
    trainer.launch = replace(trainer.launch, strategy=load_strategy(profile))
    if scope != "none":
        trainer.model_wrapped = torch.compile(trainer.model)
    assert trainer.evaluates_compiled() is compiled


@pytest.mark.parametrize("profile", ["zero2", "fsdp"])
def test_evaluation_runs_the_model_itself_where_it_is_compiled_in_place(trainer_for, profile):
    """Not DeepSpeed's engine, the Trainer's training wrapper there."""
    trainer = trainer_for(torch_compile=True, compile_plan=CompilePlan("per_block", "default"))
    trainer.launch = replace(trainer.launch, strategy=load_strategy(profile))
    trainer.model_wrapped = torch.nn.Sequential(trainer.model)  # stands in for the engine
    assert trainer._wrap_model(trainer.model, training=False) is trainer.model


def ddp_around(module: torch.nn.Module) -> DistributedDataParallel:
    """A DistributedDataParallel wrapper as evaluation sees it (its module), with no process group."""
    wrapper = DistributedDataParallel.__new__(DistributedDataParallel)
    torch.nn.Module.__init__(wrapper)
    wrapper.module = module
    return wrapper


def test_evaluation_runs_the_compiled_copy_inside_ddp_without_ddp(trainer_for):
    trainer = trainer_for(torch_compile=True, compile_plan=CompilePlan("per_block", "default"))
    compiled_copy = AutoModelForCausalLM.from_config(trainer.model.config)
    trainer.model_wrapped = ddp_around(compiled_copy)
    assert trainer._wrap_model(trainer.model, training=False) is compiled_copy


def test_evaluation_runs_the_eager_model_where_ddp_is_inside_the_compiled_wrapper(trainer_for):
    """A whole-model compile of DDP's wrapper: evaluation would run DDP's forward, whose buffer broadcast
    is a collective."""
    trainer = trainer_for(torch_compile=True, compile_plan=CompilePlan("whole", "default"))
    trainer.model_wrapped = torch.compile(ddp_around(trainer.model))
    assert trainer._wrap_model(trainer.model, training=False) is trainer.model


def test_a_zero_gradient_norm_is_warned_about(trainer_for, caplog):
    trainer = trainer_for(torch_compile=False)
    trainer.log({"loss": 10.9, "grad_norm": 0.0})
    assert "gradient norm 0" in caplog.text


def test_a_nonzero_gradient_norm_is_not_warned_about(trainer_for, caplog):
    trainer = trainer_for(torch_compile=False)
    trainer.log({"loss": 10.9, "grad_norm": 2.5})
    assert "gradient norm 0" not in caplog.text


@pytest.mark.parametrize(
    ("scope", "mode", "marks"),
    [("whole", "reduce-overhead", 2), ("per_block", "max-autotune", 2), ("whole", "default", 0),
     ("zero3_blocks", "reduce-overhead", 0), ("none", None, 0)],
)  # fmt: skip
def test_a_new_cuda_graph_step_is_marked_before_each_forward_only_when_graphs_are_recorded(
    trainer_for, monkeypatch, scope, mode, marks
):
    """The mode the compile plan has (a profile's ACCELERATE_DYNAMO_MODE, or the flag's) where accelerate
    compiles the model."""
    calls = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append(1))
    trainer = trainer_for(torch_compile=False)
    trainer.compile_plan = CompilePlan(scope, mode)
    trainer.current_gradient_accumulation_steps = 1  # set by train(), which this test does not run
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.training_step(trainer.model, batch)
    trainer.prediction_step(trainer.model, batch, prediction_loss_only=True)
    assert len(calls) == marks


@pytest.mark.parametrize(("scope", "regional"), [("per_block", True), ("whole", False)])
def test_accelerate_compiles_block_by_block_exactly_where_the_compile_plan_says(
    trainer_for, monkeypatch, scope, regional
):
    """Whatever the launcher's variable says: a plain DeepSpeed launch leaves it unset."""
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", str(not regional))
    trainer = trainer_for(torch_compile=False)
    trainer.compile_plan = CompilePlan(scope, "default")
    assert trainer._build_accelerator_args()["dynamo_plugin"].use_regional_compilation is regional


def test_ring_attention_deals_evaluation_batches_over_every_rank_and_training_batches_over_groups(
    trainer_for, monkeypatch
):
    """accelerate deals batches by its device mesh (the ring's groups share theirs); evaluation runs
    whole on each rank, so its loader is prepared without the mesh, and training's still with it."""
    trainer = trainer_for(torch_compile=False)
    monkeypatch.setattr(FinetuneTrainer, "splits_by_ring", lambda self: True)

    def dealt_by_groups(self):
        raise AssertionError("dealt over the device mesh's groups")

    monkeypatch.setattr(type(trainer.accelerator), "_prepare_device_mesh", dealt_by_groups)
    assert sum(len(b["input_ids"]) for b in trainer.get_eval_dataloader()) == 10
    with pytest.raises(AssertionError, match="device mesh's groups"):
        trainer.get_train_dataloader()


def test_ring_attention_training_batches_carry_their_labels_shifted_before_the_cut(trainer_for, monkeypatch):
    trainer = trainer_for(torch_compile=False)
    monkeypatch.setattr(FinetuneTrainer, "splits_by_ring", lambda self: True)
    labels = torch.tensor([[5, 6, 7, 8]])
    batch = {"input_ids": labels, "labels": labels}
    _, prepared = trainer._prepare_context_parallel_inputs(trainer.model.train(), batch)
    assert torch.equal(prepared["shift_labels"], torch.tensor([[6, 7, 8, -100]]))
    _, prepared = trainer._prepare_context_parallel_inputs(trainer.model.eval(), batch)
    assert "shift_labels" not in prepared  # evaluation runs each sample whole and shifts it itself


def test_deepspeeds_gradient_norm_is_passed_on_as_its_engines_tensor_not_read_on_the_host(
    trainer_for, monkeypatch
):
    """accelerate's reading of it calls `.item()`: a host sync every step, where the divergence guard
    reads the norm only before a log, evaluation or save."""
    norm = torch.tensor(2.5)
    engine = SimpleNamespace(get_global_grad_norm=lambda: norm)
    trainer = trainer_for(torch_compile=False)
    deepspeed = SimpleNamespace(
        distributed_type=DistributedType.DEEPSPEED, deepspeed_engine_wrapped=SimpleNamespace(engine=engine)
    )
    monkeypatch.setattr(trainer, "accelerator", deepspeed)
    assert trainer._clip_grad_norm(trainer.model) is norm
    assert trainer._get_grad_norm(trainer.model) is norm
    assert trainer._get_grad_norm(trainer.model, grad_norm=norm) is norm
