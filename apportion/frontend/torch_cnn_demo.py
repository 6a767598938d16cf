"""Small convolutional PyTorch models for demos, tests and ``--torch`` (random weights, seeded).

Each factory returns ``(model, example_inputs)``, the form ``--torch module:factory`` takes:
``apportion run --torch apportion.frontend.torch_cnn_demo:small_cnn --check``. Batch norm
layers get random running statistics, so that eval mode does more than the identity.
"""

from __future__ import annotations

from typing import Any


def _randomize_batch_norms(model: Any) -> Any:
    """Random running statistics and affine parameters in every batch norm, in eval mode."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
    return model.eval()


def small_cnn(batch: int = 2, size: int = 16, classes: int = 10) -> tuple[Any, tuple[Any, ...]]:
    """A small image classifier: conv 3x3 (padding 1) + batch norm + ReLU + 2x2 max pool, a
    strided conv + batch norm + ReLU, adaptive average pooling to 3x3, flatten and a linear
    layer, on ``batch`` RGB images of ``size`` x ``size``."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(3), nn.Flatten(), nn.Linear(32 * 9, classes))
    return _randomize_batch_norms(model), (torch.randn(batch, 3, size, size),)


def audio_frontend(batch: int = 1, samples: int = 400) -> tuple[Any, tuple[Any, ...]]:
    """A conv1d front end as speech encoders have (Whisper, wav2vec2 style): a wide strided
    conv over a mono waveform, GELU, a padded conv, batch norm, GELU, average pooling."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(1, 32, 10, stride=5), nn.GELU(),
        nn.Conv1d(32, 64, 3, padding=1), nn.BatchNorm1d(64), nn.GELU(),
        nn.AvgPool1d(2))
    return _randomize_batch_norms(model), (torch.randn(batch, 1, samples),)


def patch_embed(batch: int = 1, size: int = 32, patch: int = 8,
                width: int = 64) -> tuple[Any, tuple[Any, ...]]:
    """A ViT-style patch embedding: a conv with stride = kernel = ``patch``, the patches
    flattened into tokens ``[batch, (size/patch)^2, width]``, then a layer norm."""
    import torch
    from torch import nn

    class PatchEmbed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Conv2d(3, width, patch, stride=patch)
            self.norm = nn.LayerNorm(width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.proj(x).flatten(2).transpose(1, 2))

    torch.manual_seed(0)
    return PatchEmbed().eval(), (torch.randn(batch, 3, size, size),)


def depthwise_block(batch: int = 1, channels: int = 32,
                    size: int = 12) -> tuple[Any, tuple[Any, ...]]:
    """A MobileNet-style separable block: depthwise 3x3 conv (groups = channels) + batch norm +
    ReLU6, then a pointwise 1x1 conv + batch norm."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
        nn.BatchNorm2d(channels), nn.ReLU6(),
        nn.Conv2d(channels, 2 * channels, 1, bias=False), nn.BatchNorm2d(2 * channels))
    return _randomize_batch_norms(model), (torch.randn(batch, channels, size, size),)
