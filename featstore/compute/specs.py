"""What a job is asked to run on: the records every job's config composes, each declared once.

- `ModelSpec`: which network (a torchvision/timm name, its weights, a crop-size override);
- `ImageSource`: which images (a folder, an optional labels file, an optional deterministic subset);
- `RunOptions`: how to run (device, decoders, batch size, seed, CPU threads, progress bars).

`featstore build`, `circuits`, `cost`, `probe`, `zoo` and `study` configs hold these instead of copies of their
fields, the CLI has one option decorator per record (`featstore.cli.options`), and study/zoo TOML entries map onto
the same records (`featstore.workflows.toml_files`). Fields a job does not use are left at their defaults. Each
record checks its fields as `featstore.schema.FIELDS` declares them, as the CLI options and TOML keys do.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from featstore.errors import FeatstoreError, Name
from featstore.schema import DEVICE, WEIGHTS, check_fields


@dataclass(frozen=True)
class ModelSpec:
    """A network: `model` as `--model` takes it ('resnet50', 'timm/NAME'), `weights` as `--weights` takes it."""

    model: str
    weights: str = WEIGHTS
    image_size: int | None = None

    def __post_init__(self) -> None:
        check_fields(self, ("image_size",))


@dataclass(frozen=True)
class ImageSource:
    """An ImageFolder tree (or a flat folder with a labels CSV), optionally a seeded subset of `limit` images
    whose ids stay those of the whole set."""

    data: Path
    labels: Path | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", Path(self.data))
        if self.labels is not None:
            object.__setattr__(self, "labels", Path(self.labels))
        check_fields(self, ("limit",))

    def check_exists(self) -> None:
        """Refuse a `data` folder that is not there without loading torch, so that a command says so at once,
        before it loads a model (`discover` reads the folder)."""
        if not self.data.expanduser().is_dir():
            raise FeatstoreError(f"image folder {self.data} does not exist; pass ", Name("data"),
                                 " (an ImageFolder root or a flat folder)")

    def discover(self, seed: int = 0):
        """The images (featstore.images.datasets.ImageSet); `seed` draws the --limit subset."""
        from featstore.images.datasets import discover

        return discover(self.data, self.labels, self.limit, seed)


@dataclass(frozen=True)
class RunOptions:
    """How a job runs. `batch_size` None means the job's own default (build 64, circuits 32); `threads` None
    means the CPU thread policy decides; `workers` None means the loader's default."""

    device: str = DEVICE
    workers: int | None = None
    batch_size: int | None = None
    seed: int = 0
    threads: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        check_fields(self, ("workers", "batch_size", "seed", "threads"))
        if self.threads is not None:  # (imports torch: only for a command that computes)
            from featstore.threads import check_pinned

            check_pinned(self.threads)

    def batch(self, default: int) -> int:
        return self.batch_size if self.batch_size is not None else default


def field_names(record: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(record))


def split_options(options: dict[str, Any], *records: type) -> tuple[list[Any], dict[str, Any]]:
    """Take each record's fields out of a flat option dict (what click hands a command): the records built from
    them, and what is left. A record none of whose fields is present gets all its defaults."""
    rest = dict(options)
    built = []
    for record in records:
        mine = {name: rest.pop(name) for name in field_names(record) if name in rest}
        built.append(record(**mine))
    return built, rest
