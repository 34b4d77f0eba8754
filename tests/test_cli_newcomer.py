"""What a newcomer meets first: one way to name a store or model in each command's help, `anchors`
answered from a preset without torch, `sql` showing a screenful, help free of the project's history."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from synthetic import class_clusters, write_feature_store

from featstore.cli.main import cli
from featstore.nets.anchors import PRESETS, TIMM_PRESETS
from featstore.nets.listing import _built_listing, preset_listing

from conftest import run_cli

PRESET_MODELS = [*PRESETS, *(f"timm/{name}" for name in TIMM_PRESETS), "convnext_tiny.fb_in1k"]  # a timm tag too


@pytest.mark.parametrize("model", PRESET_MODELS)
def test_a_presets_listing_is_what_the_built_model_gives(model):
    """The lines read from the preset alone equal those of the model built and its anchors resolved."""
    assert preset_listing(model) == _built_listing(model, False)


def test_anchors_of_a_preset_import_no_torch():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom featstore.cli.main import cli\n"
            "r = CliRunner().invoke(cli, ['anchors', '--model', 'resnet18'])\n"
            "print(r.exit_code, 'torch' in sys.modules)\nprint(r.output)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    status, lines = done.stdout.split("\n", 1)
    assert status == "0 False", done.stdout + done.stderr
    assert lines.splitlines()[8] == "  8  layer4.0.mid  (hooks layer4.0.bn1 output + relu)"
    assert preset_listing("resnet18.a1_in1k") is None and preset_listing("torchvision/vit_base_patch16_224") is None


@pytest.mark.parametrize("command,flag", [("info", "--store"), ("verify", "--store"), ("gc", "--store"),
                                          ("anchors", "--model")])
def test_help_shows_one_way_to_name_the_store_or_model(command, flag):
    text = run_cli(command, "--help").output
    usage = text.splitlines()[0]
    assert usage.endswith(f" {command} [OPTIONS]"), usage
    assert flag in text


def test_the_old_positional_spelling_still_reads(tmp_path):
    feats, labels = class_clusters(40, 2, [4, 4], seed=0)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 2)
    assert run_cli("info", store).output == run_cli("info", "--store", store).output


def test_no_help_text_carries_the_projects_history():
    texts = [run_cli("--help").output] + [run_cli(name, "--help").output for name in cli.commands]
    history = re.compile(r"old spelling|[Ii]ssue \d|before issue|used to", re.I)
    found = [line for text in texts for line in text.splitlines() if history.search(line)]
    assert not found, found
    assert "one linear probe" not in texts[0]


def test_ctrl_c_outside_a_write_is_one_line_and_status_130():
    """click turns Ctrl-C (or EOF at a prompt) into Abort: one featstore line and the shell's 130, not 'Aborted!'
    and 1."""

    def stop():
        raise KeyboardInterrupt

    cli.command("ctrl-c-now")(stop)
    try:
        result = CliRunner().invoke(cli, ["ctrl-c-now"])
    finally:
        del cli.commands["ctrl-c-now"]
    assert result.exit_code == 130 and result.output.strip() == "featstore: interrupted", result.output


def test_featstore_errors_are_value_errors_and_an_interrupt_is_not():
    """A bad input is a ValueError in Python (as scikit-learn's refusals are: `except ValueError` catches it); the
    rolled-back Ctrl-C stays a KeyboardInterrupt that no `except ValueError` or `except Exception` swallows."""
    from featstore.errors import FeatstoreError, Interrupted
    from featstore.probing.split import checked

    with pytest.raises(ValueError, match="val_frac=1.5"):
        checked(val_frac=1.5)
    assert issubclass(FeatstoreError, ValueError)
    assert issubclass(Interrupted, KeyboardInterrupt) and not issubclass(Interrupted, Exception)
