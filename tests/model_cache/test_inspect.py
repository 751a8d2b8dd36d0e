"""`pagoda-runtime inspect`, the sizing Job of a pvc:// model: the facts it reports for the operator."""

from __future__ import annotations

import json

from pagoda_runtime.cli import main
from pagoda_runtime.loading.model_source import load_model_source

from tests.runtime.tiny_models import build_tiny_gguf, build_tiny_model


def test_reports_the_shape_of_a_folder_and_of_a_gguf_file(tmp_path, capsys):
    tiny = build_tiny_model(tmp_path / "llama", "llama3")
    log = tmp_path / "termination-log"
    assert main(["inspect", str(tiny), "--termination-log", str(log)]) == 0
    facts = json.loads(log.read_text())
    assert facts == {
        # As JSON carries it: the architecture's tuples (layer types, dense layers) as lists.
        "architecture": json.loads(json.dumps(vars(load_model_source(tiny).config.architecture))),
        "storedQuantization": None,
    }
    assert json.loads(capsys.readouterr().out.strip()) == facts

    gguf = build_tiny_gguf(tiny, tmp_path / "tiny.Q8_0.gguf", "Q8_0")
    assert main(["inspect", str(gguf), "--termination-log", str(log)]) == 0
    assert json.loads(log.read_text())["storedQuantization"] == "gguf"


def test_a_path_that_is_no_checkpoint_fails_with_its_reason(tmp_path):
    log = tmp_path / "termination-log"
    assert main(["inspect", str(tmp_path / "missing"), "--termination-log", str(log)]) == 1
    message = log.read_text()
    assert message.startswith(f"reading the checkpoint {tmp_path / 'missing'} failed: FileNotFoundError")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["inspect", str(empty), "--termination-log", str(log)]) == 1
    assert "failed" in log.read_text()
