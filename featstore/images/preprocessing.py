"""The model's eval transform, split where the corruption views are applied.

torchvision's ImageClassification and timm's eval transform are resize -> center crop -> [0,1] ->
normalise. Corruptions (docs/design.md §2) act on the cropped image in [0,1], so featstore runs the first half in the
data loader (as uint8, cheap to move) and normalises on the device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from featstore.errors import FeatstoreError

if TYPE_CHECKING:  # the record is read without torch (`featstore info`); the transforms below load it
    import torch
    from PIL import Image


@dataclass(frozen=True)
class Preprocessing:
    """Resize the shorter side to `resize`, center-crop `crop`, normalise with `mean`/`std`."""

    resize: int
    crop: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bilinear"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Preprocessing:
        return cls(d["resize"], d["crop"], tuple(d["mean"]), tuple(d["std"]), d["interpolation"])

    def with_image_size(self, size: int | None) -> Preprocessing:
        """Override the crop (CPU users, tests): resize to size*256/224 first, as ImageNet eval does."""
        if size is None:
            return self
        if size < 16:
            raise FeatstoreError("is too small (minimum 16)", field="image_size", value=size)
        return Preprocessing(round(size * 256 / 224), size, self.mean, self.std, self.interpolation)

    def crop_uint8(self, image: Image.Image) -> torch.Tensor:
        """Resize and crop a PIL image exactly as torchvision's ImageClassification does; uint8 [3,H,W]."""
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        image = F.resize(image, [self.resize], interpolation=InterpolationMode(self.interpolation), antialias=True)
        image = F.center_crop(image, [self.crop])
        return F.pil_to_tensor(image)

    def normalize(self, batch: torch.Tensor) -> torch.Tensor:
        """[B,3,H,W] uint8 or float in [0,1] -> normalised float32, on whatever device `batch` is."""
        import torch

        if batch.dtype == torch.uint8:
            batch = batch.float().div_(255)
        mean = torch.tensor(self.mean, device=batch.device, dtype=batch.dtype).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=batch.device, dtype=batch.dtype).view(1, 3, 1, 1)
        return batch.sub(mean).div_(std)
