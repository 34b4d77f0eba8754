"""The three decode strategies deliver the same batches, in plan order, errors included."""

from __future__ import annotations

import shutil

import torch

from featstore.images.datasets import ViewDataset, discover
from featstore.images.loading import iterate_batches
from featstore.images.views import parse_views
from featstore.nets.models import load_model


def test_serial_threaded_and_dataloader_batches_are_identical(image_dir, tmp_path):
    data = shutil.copytree(image_dir, tmp_path / "d")
    (data / "class_01" / "img_0000.jpg").write_bytes(b"broken")
    prep = load_model("resnet18", weights="none", image_size=32).preprocessing
    dataset = ViewDataset(discover(data), prep, parse_views("clean,gaussian_noise-1,brightness-2"))
    plan = [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11]]
    cpu = torch.device("cpu")
    runs = [list(iterate_batches(dataset, plan, cpu, workers=0)),
            list(iterate_batches(dataset, plan, cpu, workers=2)),
            list(iterate_batches(dataset, plan, cpu, workers=2, overlap=True))]
    for run in runs:
        assert [rows for rows, _, _ in run] == plan
        assert [e is not None for e in run[1][2]] == [False, False, False] and run[0][2][4] is not None
        assert run[0][1][0].dtype == torch.uint8 and run[0][1][1].dtype == torch.float32
    for other in runs[1:]:
        for (_, a, ea), (_, b, eb) in zip(runs[0], other, strict=True):
            assert ea == eb and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
