"""Token-weighted evaluation loss: per-sample sums on each rank, divided once over all tokens."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, EvalPrediction

from finetune import losses
from finetune.arguments import LOWER_IS_BETTER
from finetune.data import arrange_splits, load_raw, split_tokens
from finetune.errors import FinetuneError
from finetune.evaluation import (
    Window,
    evaluate_saved_model,
    perplexity,
    sliding_window_loss,
    sliding_windows,
    token_weighted_loss,
    window_labels,
)
from finetune.losses import loss_sums_per_sample
from finetune.run_flags import DataArguments


def test_loss_sums_reproduce_the_models_shifted_mean_loss():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 6, 11), torch.randint(0, 11, (2, 6))
    sums = loss_sums_per_sample(logits, labels)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))
    assert sums[:, 1].tolist() == [5.0, 5.0]
    assert (sums[:, 0].sum() / sums[:, 1].sum()).item() == pytest.approx(expected.item(), rel=1e-6)


def test_a_long_sample_is_summed_a_chunk_of_tokens_at_a_time_to_the_same_loss(monkeypatch):
    """The float32 copy and softmax of a long block's logits are a chunk's, not the block's."""
    monkeypatch.setattr(losses, "CHUNK_LOGITS", 2 * 4 * 11)  # 4 positions of 2 samples, 11 entries each
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 10, 11).bfloat16(), torch.randint(0, 11, (2, 10))
    labels[1, 6:] = -100
    seen: list[tuple[int, ...]] = []
    summed_by_chunks = losses.summed_by_chunks

    def recording(chunks, shifted):
        def each(chunks=chunks):
            for chunk in chunks:
                seen.append(tuple(chunk.shape))
                yield chunk

        return summed_by_chunks(each(), shifted)

    monkeypatch.setattr(losses, "summed_by_chunks", recording)
    sums = loss_sums_per_sample(logits, labels)
    assert seen == [(2, 4, 11), (2, 4, 11), (2, 2, 11)]
    whole = [F.cross_entropy(logits[i, :-1].float(), labels[i, 1:], reduction="sum").item() for i in range(2)]
    assert sums[:, 0].tolist() == pytest.approx(whole, rel=1e-6)
    assert sums[:, 1].tolist() == [9.0, 5.0]


def test_padding_labels_are_not_counted():
    logits, labels = torch.zeros(1, 6, 4), torch.tensor([[1, 2, 3, -100, -100, -100]])
    sums = loss_sums_per_sample(logits, labels)
    assert sums[0, 1].item() == 2.0
    assert sums[0, 0].item() == pytest.approx(2 * math.log(4))


def test_logits_in_a_tuple_are_unpacked():
    logits, labels = torch.zeros(1, 3, 4), torch.tensor([[1, 2, 3]])
    assert loss_sums_per_sample((logits,), labels).tolist() == loss_sums_per_sample(logits, labels).tolist()


def test_loss_is_weighted_by_tokens_not_by_samples():
    # sample A: 5 tokens, mean loss 2.0; sample B: 1 token, loss 6.0
    prediction = EvalPrediction(predictions=np.array([[10.0, 5.0], [6.0, 1.0]]), label_ids=np.zeros((2, 1)))
    metrics = token_weighted_loss(prediction)
    assert metrics["token_loss"] == pytest.approx(16.0 / 6.0)  # a mean of sample means would be 4.0
    assert metrics["tokens"] == 6
    assert metrics["perplexity"] == pytest.approx(math.exp(16.0 / 6.0))


def test_the_best_model_metrics_are_what_the_evaluation_reports_besides_its_token_count():
    prediction = EvalPrediction(predictions=np.array([[10.0, 5.0]]), label_ids=np.zeros((1, 1)))
    reported = {"loss", *token_weighted_loss(prediction)} - {"tokens"}  # the Trainer adds eval_loss
    assert reported == set(LOWER_IS_BETTER)


def test_perplexity_of_a_huge_loss_is_infinite():
    assert perplexity(1e6) == math.inf


# Sliding-window evaluation (finetune eval)


def test_windows_without_overlap_are_the_training_blocks():
    assert sliding_windows(10, 4, 4) == [Window(0, 4, 4), Window(4, 8, 4), Window(8, 10, 2)]


def test_overlapping_windows_predict_only_what_the_previous_window_did_not():
    assert sliding_windows(10, 4, 2) == [Window(0, 4, 4), Window(2, 6, 2), Window(4, 8, 2), Window(6, 10, 2)]


def test_window_labels_mask_the_context():
    tokens = torch.arange(10)
    assert window_labels(tokens, Window(2, 6, 2)).tolist() == [-100, -100, 4, 5]


@pytest.mark.parametrize("stride", [1, 3, 7])
def test_overlapping_windows_predict_every_token_after_the_first_exactly_once(tiny_gpt2_dir, stride):
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    tokens = torch.arange(1000, 1050)
    _, count = sliding_window_loss(model, tokens, sliding_windows(len(tokens), 8, stride), batch_size=4)
    assert count == len(tokens) - 1


def test_blocks_without_overlap_do_not_predict_their_first_token(tiny_gpt2_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    tokens = torch.arange(1000, 1050)
    windows = sliding_windows(len(tokens), 8, 8)
    _, count = sliding_window_loss(model, tokens, windows, batch_size=4)
    assert count == len(tokens) - len(windows)


def test_saved_model_evaluates_on_a_local_split(tiny_gpt2_dir, make_text_file):
    folder = make_text_file("corpus/valid.txt", "Words of the validation split.\n" * 30).parent
    make_text_file("corpus/train.txt", "Words of the training split.\n" * 30)
    args = DataArguments(dataset=str(folder))
    result = evaluate_saved_model(str(tiny_gpt2_dir), args, "validation", 16, None, 4, None)
    assert (result["block_size"], result["stride"]) == (16, 16)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))


def test_stride_longer_than_the_block_is_an_error(tiny_gpt2_dir, make_text_file):
    path = make_text_file("corpus.txt", "Some text.\n" * 30)
    with pytest.raises(FinetuneError, match="--stride must be between 1 and the block size"):
        evaluate_saved_model(str(tiny_gpt2_dir), DataArguments(dataset=str(path)), "train", 16, 32, 4, None)


# Split names in `finetune eval` mean the file of that name (training may stand one in for another)


def tokens_of(args, tokenizer, split, seed=42):
    return split_tokens(load_raw(args)[0], args, tokenizer, split, seed)


@pytest.fixture
def validation_and_test_only(make_text_file):
    """A dataset laid out like the offline WikiText-2 copy: validation and test files, no train file."""
    make_text_file("corpus/wiki.valid.tokens", "Words of the validation file.\n" * 20)
    return make_text_file("corpus/wiki.test.tokens", "Text from the test file.\n" * 20).parent


@pytest.mark.parametrize(("split", "text"), [("test", "Text from the test file.\n"),
                                             ("validation", "Words of the validation file.\n")])  # fmt: skip
def test_eval_split_is_the_file_of_that_name(validation_and_test_only, gpt2_tokenizer, split, text):
    tokens = tokens_of(DataArguments(dataset=str(validation_and_test_only)), gpt2_tokenizer, split)
    assert gpt2_tokenizer.decode(tokens) == text * 20


def test_eval_of_a_missing_split_names_the_splits_there_are(validation_and_test_only, gpt2_tokenizer):
    args = DataArguments(dataset=str(validation_and_test_only))
    with pytest.raises(FinetuneError, match=r"has no train split \(it has: test, validation\)"):
        tokens_of(args, gpt2_tokenizer, "train")


def test_eval_on_validation_of_a_train_only_dataset_uses_the_share_training_held_out(
    make_text_file, gpt2_tokenizer
):
    path = make_text_file("corpus.txt", "".join(f"Line number {i}.\n" for i in range(100)))
    args = DataArguments(dataset=str(path))
    tokens = tokens_of(args, gpt2_tokenizer, "validation")
    held_out = arrange_splits(load_raw(args)[0], args.validation_split_percentage, 42)[0]["validation"]
    assert gpt2_tokenizer.decode(tokens) == "".join(held_out["text"])


def test_readme_eval_of_the_offline_wikitext_test_split_runs(tiny_gpt2_dir):
    args = DataArguments(dataset="wikitext-2-raw-v1")
    result = evaluate_saved_model(str(tiny_gpt2_dir), args, "test", 16, None, 4, 64)
    assert (result["split"], result["tokens"]) == ("test", 64 - 4)


def test_eval_reads_the_dataset_once(tiny_gpt2_dir, monkeypatch):
    from finetune import data, evaluation

    reads, load_raw = [], data.load_raw

    def counted_load_raw(args):
        reads.append(args.dataset)
        return load_raw(args)

    monkeypatch.setattr(data, "load_raw", counted_load_raw)
    monkeypatch.setattr(evaluation, "load_raw", counted_load_raw)
    args = DataArguments(dataset="wikitext-2-raw-v1")
    evaluate_saved_model(str(tiny_gpt2_dir), args, "test", 16, None, 4, 64)
    assert reads == ["wikitext-2-raw-v1"]


def test_offline_wikitext_test_split_is_its_test_file(data_dir, gpt2_tokenizer):
    lines = (data_dir / "wikitext-2-v1" / "wiki.test.tokens").read_text().splitlines(keepends=True)
    expected = sum(len(ids) for ids in gpt2_tokenizer(lines, add_special_tokens=False)["input_ids"])
    tokens = tokens_of(DataArguments(dataset="wikitext-2-raw-v1"), gpt2_tokenizer, "test")
    assert len(tokens) == expected


def test_a_result_names_the_variant_it_was_computed_on(tiny_gpt2_dir, capsys):
    """Offline, WikiText-2's raw variant is not here: its tokenized v1 is, and the result says so."""
    from finetune import cli

    assert cli.main(["eval", str(tiny_gpt2_dir), "--dataset", "wikitext-2-raw-v1", "--split", "test",
                     "--block_size", "64", "--max_tokens", "256"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["dataset"], result["dataset_used"]) == ("wikitext-2-raw-v1", "wikitext-2-v1")


def test_a_run_folder_is_evaluated_at_the_block_size_it_trained_at(tiny_gpt2_dir, tmp_path, data_dir):
    """Its summary records 32; the model's context (128 here, 1024 for GPT-2) is longer than it ever saw."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_gpt2_dir, run_dir)
    (run_dir / "run_summary.json").write_text(json.dumps({"block_size": 32}))
    args = DataArguments(dataset="wikitext-2-raw-v1")
    result = evaluate_saved_model(str(run_dir), args, "validation", None, None, 4, 256)
    assert result["block_size"] == 32
    assert evaluate_saved_model(str(tiny_gpt2_dir), args, "validation", None, None, 4, 256)["block_size"] > 32


def test_a_checkpoint_is_evaluated_at_the_block_size_its_run_trained_at(tiny_gpt2_dir, tmp_path, data_dir):
    """A checkpoint has no summary yet (the run may still be going): its manifest holds the run's flags."""
    import shutil

    from finetune.checkpoint import write_manifest

    checkpoint = tmp_path / "run" / "checkpoint-5"
    shutil.copytree(tiny_gpt2_dir, checkpoint)
    write_manifest(checkpoint, 5, "run", run={"flags": {"block_size": 32}})
    args = DataArguments(dataset="wikitext-2-raw-v1")
    assert evaluate_saved_model(str(checkpoint), args, "validation", None, None, 4, 256)["block_size"] == 32


def run_folder_with_record(model_dir, folder, record_kind: str, flags: dict, data_source: str | None = None):
    """A copy of a saved model whose run left `flags` in its summary (an output_dir) or manifest."""
    import shutil

    from finetune.checkpoint import write_manifest

    shutil.copytree(model_dir, folder)
    if record_kind == "summary":
        summary = {key: flags[key] for key in ("dataset", "seed") if key in flags}
        arguments = {key: value for key, value in flags.items() if key not in summary}
        record = {**summary, "data_source": data_source, "arguments": arguments}
        (folder / "run_summary.json").write_text(json.dumps(record))
    else:
        write_manifest(folder, 5, "run", run={"flags": flags, "data_source": data_source})
    return folder


@pytest.mark.parametrize("record_kind", ["summary", "manifest"])
def test_validation_of_train_only_data_is_the_share_the_models_run_held_out(
    record_kind, tiny_gpt2_dir, make_text_file, gpt2_tokenizer, tmp_path
):
    """Carved with eval's own seed and percentage it was mostly text the model had trained on."""
    path = make_text_file("corpus.txt", "".join(f"Line number {i}.\n" for i in range(100)))
    args = DataArguments(dataset=str(path))
    flags = {"dataset": str(path), "seed": 7, "validation_split_percentage": 20}
    model = run_folder_with_record(tiny_gpt2_dir, tmp_path / "run", record_kind, flags)
    held_out = arrange_splits(load_raw(args)[0], 20, 7)[0]["validation"]
    held_out_tokens = len(gpt2_tokenizer("".join(held_out["text"]))["input_ids"])
    result = evaluate_saved_model(str(model), args, "validation", 128, None, 4, None)
    assert (result["windows"], result["tokens"]) == (1, held_out_tokens - 1)
    other_data = DataArguments(dataset=str(make_text_file("other.txt", path.read_text())))
    assert evaluate_saved_model(str(model), other_data, "validation", 128, None, 4, None)["tokens"] < 60


def test_an_exported_checkpoint_is_evaluated_at_its_runs_block_size_on_its_held_out_share(
    tiny_gpt2_dir, make_text_file, gpt2_tokenizer, tmp_path
):
    """The export has no summary or manifest: it carries the run's record beside the weights."""
    from finetune.export import export_checkpoint

    path = make_text_file("corpus.txt", "".join(f"Line number {i}.\n" for i in range(100)))
    args = DataArguments(dataset=str(path))
    flags = {"dataset": str(path), "block_size": 32, "seed": 7, "validation_split_percentage": 20}
    checkpoint = run_folder_with_record(tiny_gpt2_dir, tmp_path / "run" / "checkpoint-5", "manifest", flags)
    exported = export_checkpoint(checkpoint, tmp_path / "exported")
    held_out = arrange_splits(load_raw(args)[0], 20, 7)[0]["validation"]
    held_out_tokens = len(gpt2_tokenizer("".join(held_out["text"]))["input_ids"])
    result = evaluate_saved_model(str(exported), args, "validation", None, None, 4, None)
    assert result["block_size"] == 32
    assert result["tokens"] == held_out_tokens - result["windows"]  # a window's first token is context


def test_an_export_knows_its_runs_data_by_the_files_whatever_path_names_them(
    tiny_gpt2_dir, make_text_file, gpt2_tokenizer, tmp_path
):
    """The run named its data one way, eval names the same file through a link: still the run's data."""
    from finetune.export import export_checkpoint

    path = make_text_file("corpus.txt", "".join(f"Line number {i}.\n" for i in range(100)))
    link = tmp_path / "linked.txt"
    link.symlink_to(path)
    flags = {"dataset": "corpus.txt", "block_size": 32, "seed": 7, "validation_split_percentage": 20}
    run = tmp_path / "run" / "checkpoint-5"
    checkpoint = run_folder_with_record(tiny_gpt2_dir, run, "manifest", flags, data_source=str(path))
    exported = export_checkpoint(checkpoint, tmp_path / "exported")
    held_out = arrange_splits(load_raw(DataArguments(dataset=str(path)))[0], 20, 7)[0]["validation"]
    held_out_tokens = len(gpt2_tokenizer("".join(held_out["text"]))["input_ids"])
    result = evaluate_saved_model(
        str(exported), DataArguments(dataset=str(link)), "validation", 32, None, 4, None
    )
    assert result["tokens"] == held_out_tokens - result["windows"]


def test_validation_of_a_copy_without_train_is_said_to_be_what_the_models_run_trained_on(
    validation_and_test_only, tiny_gpt2_dir, tmp_path, capsys
):
    args = DataArguments(dataset=str(validation_and_test_only))
    model = run_folder_with_record(tiny_gpt2_dir, tmp_path / "run", "summary", {"dataset": args.dataset})
    evaluate_saved_model(str(model), args, "validation", 16, None, 4, 64)
    assert "this is text the model trained on (--split test is held out)" in capsys.readouterr().err
    evaluate_saved_model(str(model), args, "test", 16, None, 4, 64)
    evaluate_saved_model(str(tiny_gpt2_dir), args, "validation", 16, None, 4, 64)
    assert "trained on" not in capsys.readouterr().err
