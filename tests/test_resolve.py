"""Offline-first name resolution: local path, then $FINETUNE_DATA_DIR, then (unless offline) the Hub."""

import os
import time

import pytest
from huggingface_hub import constants as hub_constants

from finetune.cli import main as cli_main
from finetune.errors import FinetuneError
from finetune.models import resolve_model
from finetune.resolve import HUB_PROBE_TIMEOUT_S, describe_tried, hub_unreachable, resolve

UNREACHABLE_HUB = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused


def test_existing_local_path_wins_over_the_data_dir(tmp_path, monkeypatch, data_dir):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    found = resolve("gpt2")
    assert (data_dir / "gpt2").is_dir()
    assert found.local_path.resolve() == tmp_path / "gpt2"
    assert found.hub_id is None


def test_name_under_the_data_dir_resolves_there(data_dir):
    found = resolve("tiny-shakespeare")
    assert found.local_path == data_dir / "tiny-shakespeare"
    assert found.local_path is not None


def test_other_local_name_under_the_data_dir_is_found(data_dir):
    found = resolve("wikitext-2-raw-v1", local_names=("wikitext-2-raw-v1", "wikitext-2-v1"))
    assert found.local_path == data_dir / "wikitext-2-v1"


def test_hub_style_model_name_resolves_to_the_data_dir_folder(data_dir):
    assert resolve_model("openai-community/gpt2-medium") == str(data_dir / "gpt2-medium")


def test_unknown_name_offline_has_no_local_path_and_no_hub_id(data_dir):
    found = resolve("no-such-model-xyz")
    assert found.local_path is None
    assert found.hub_id is None
    assert any(str(data_dir) in place for place in found.tried)
    assert "HF_HUB_OFFLINE" in describe_tried(found)


def test_unset_data_dir_is_reported_as_tried(monkeypatch):
    monkeypatch.delenv("FINETUNE_DATA_DIR")
    found = resolve("no-such-model-xyz")
    assert found.local_path is None
    assert any("FINETUNE_DATA_DIR" in place for place in found.tried)


def test_resolve_model_of_an_unknown_name_says_what_it_looked_for(data_dir):
    with pytest.raises(FinetuneError, match="no-such-model-xyz") as error:
        resolve_model("no-such-model-xyz")
    assert str(data_dir / "no-such-model-xyz") in str(error.value)


def test_relative_data_dir_is_made_absolute_for_launched_processes(monkeypatch, tmp_path, data_dir):
    monkeypatch.setenv("FINETUNE_DATA_DIR", os.path.relpath(data_dir, tmp_path))
    assert cli_main(["profiles"]) == 0
    assert os.environ["FINETUNE_DATA_DIR"] == str(data_dir)


def test_name_not_found_says_the_data_dir_does_not_exist(monkeypatch, tmp_path):
    monkeypatch.setenv("FINETUNE_DATA_DIR", "no-such-folder")
    with pytest.raises(
        FinetuneError, match=rf"FINETUNE_DATA_DIR={tmp_path}/no-such-folder \(does not exist\)"
    ):
        resolve_model("gpt2")


def test_name_not_found_lists_what_the_data_dir_holds(data_dir):
    with pytest.raises(FinetuneError, match=rf"FINETUNE_DATA_DIR={data_dir} \(holds: .*gpt2-medium, .*gsm8k"):
        resolve_model("gtp2-medium")


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Hub mode on (no HF_HUB_OFFLINE), pointed at a port where nothing listens."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", UNREACHABLE_HUB)
    hub_unreachable.cache_clear()
    yield
    hub_unreachable.cache_clear()


def test_unreachable_hub_is_reported_without_retrying(unreachable_hub):
    started = time.monotonic()
    found = resolve("no-such-model-xyz")
    assert time.monotonic() - started < HUB_PROBE_TIMEOUT_S + 2
    assert (found.local_path, found.hub_id) == (None, None)
    assert f"the Hub at {UNREACHABLE_HUB} (unreachable: " in describe_tried(found)


def test_unknown_dataset_with_the_hub_unreachable_fails_through_the_cli_without_asking_the_hub(
    unreachable_hub, data_dir, monkeypatch, capsys
):
    """One probe, then one line: datasets' own Hub calls (about 25 s of retries) never start."""
    import finetune.data

    asked = []
    monkeypatch.setenv("FINETUNE_DATA_DIR", str(data_dir))
    monkeypatch.setattr(finetune.data, "load_dataset", lambda *args, **kwargs: asked.append(args))
    with pytest.raises(SystemExit) as stopped:
        cli_main(["eval", str(data_dir / "gpt2"), "--dataset", "wikitxt"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("finetune: error: dataset 'wikitxt' not found; ")
    assert f"FINETUNE_DATA_DIR={data_dir} (holds: " in error
    assert "unreachable" in error
    assert asked == []


def test_a_hub_that_answers_with_an_error_status_is_reachable(monkeypatch):
    """Any HTTP answer means the network is there; only no answer sends the user to local names."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(hub_constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    hub_unreachable.cache_clear()
    try:
        assert hub_unreachable() is None
    finally:
        hub_unreachable.cache_clear()
        server.shutdown()
