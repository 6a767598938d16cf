"""Factories in each ``--torch`` return form (keyword inputs, the keyed dict with
``dynamic_shapes``), for tests/cli/test_torch_inputs.py; importable with tests/cli on
PYTHONPATH: ``apportion run --torch torch_input_factories:gpt2_masked --check``."""

from __future__ import annotations

from typing import Any

from apportion.frontend.torch_demo import mlp, tiny_gpt2, tiny_llama


def gpt2_masked() -> tuple[Any, Any, Any]:
    """GPT-2 given its attention mask by keyword: ``(model, args, kwargs)``."""
    import torch

    model, (ids,) = tiny_gpt2(layers=1)
    return model, (ids,), {"attention_mask": torch.ones_like(ids)}


def llama_masked() -> tuple[Any, Any, Any]:
    """Llama given its attention mask by keyword: ``(model, args, kwargs)``."""
    import torch

    model, (ids,) = tiny_llama(layers=1, hidden=128)
    return model, (ids,), {"attention_mask": torch.ones_like(ids)}


def llama_keyed() -> tuple[Any, dict[str, Any]]:
    """Llama in the keyed form, with ``dynamic_shapes`` for a run-time sequence length."""
    import torch

    model, (ids,) = tiny_llama(layers=1, hidden=128)
    seq = torch.export.Dim("seq", min=2, max=64)
    return model, {"args": (ids,), "kwargs": {"attention_mask": torch.ones_like(ids)},
                   "dynamic_shapes": {"input_ids": {1: seq}, "attention_mask": {1: seq}}}


def mlp_keyword() -> tuple[Any, dict[str, Any]]:
    """The demo MLP with its input by keyword, in the keyed form."""
    model, (x,) = mlp()
    return model, {"kwargs": {"x": x}}


def four_things() -> tuple[Any, ...]:
    """A malformed result: four values."""
    model, (x,) = mlp()
    return model, (x,), {}, None


def bad_key() -> tuple[Any, dict[str, Any]]:
    """A malformed keyed form: an unknown key."""
    model, (x,) = mlp()
    return model, {"args": (x,), "shapes": None}


def bad_kwargs() -> tuple[Any, Any, Any]:
    """A malformed third value: not a dict."""
    model, (x,) = mlp()
    return model, (x,), [x]
