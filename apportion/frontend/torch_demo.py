"""Small PyTorch models for demos, tests and ``--torch`` (random weights, seeded, no download).

Each factory returns ``(model, example_inputs)`` (or ``(model, args, kwargs)``), the form
``--torch module:factory`` takes:
``apportion plan --torch apportion.frontend.torch_demo:tiny_llama``.
"""

from __future__ import annotations

from typing import Any

#: token count of the example inputs
SEQ = 16


def tiny_llama(layers: int = 2, hidden: int = 256, seq: int = SEQ) -> tuple[Any, tuple[Any, ...]]:
    """A Llama-style decoder from Hugging Face ``transformers``: ``layers`` layers of width
    ``hidden``, 4 heads and 2 KV heads (grouped-query attention), rotary embeddings, a causal
    mask, a vocabulary of 1000."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=1000,
                                   max_position_embeddings=max(128, seq), use_cache=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return model, (torch.randint(0, cfg.vocab_size, (1, seq)),)


def tiny_gpt2(layers: int = 2, seq: int = SEQ) -> tuple[Any, tuple[Any, ...]]:
    """A GPT-2 from ``transformers``: ``layers`` layers of width 128, 4 heads, a vocabulary of
    1000."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=128, n_head=4, vocab_size=1000,
                                  n_positions=max(128, seq), bos_token_id=0, eos_token_id=0,
                                  use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    return model, (torch.randint(0, cfg.vocab_size, (1, seq)),)


def mlp(tokens: int = 64, hidden: int = 256) -> tuple[Any, tuple[Any, ...]]:
    """A gated MLP block in plain ``torch.nn`` (SiLU(x W_gate) * x W_up) W_down."""
    import torch

    class GatedMLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = torch.nn.Linear(hidden, 4 * hidden, bias=False)
            self.up = torch.nn.Linear(hidden, 4 * hidden, bias=False)
            self.down = torch.nn.Linear(4 * hidden, hidden, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))

    torch.manual_seed(0)
    return GatedMLP().eval(), (torch.randn(tokens, hidden),)


def tiny_llama_bf16(layers: int = 2, hidden: int = 256, seq: int = SEQ
                    ) -> tuple[Any, tuple[Any, ...]]:
    """``tiny_llama`` with its weights in bfloat16 (eager PyTorch then computes in bfloat16)."""
    import torch

    model, ids = tiny_llama(layers, hidden, seq)
    return model.to(torch.bfloat16), ids


def special_functions(tokens: int = 8, width: int = 64) -> tuple[Any, tuple[Any, ...]]:
    """A block with nodes apportion has no lowering for (``floor``, the Bessel function
    ``i0``, a ``sort``) between ordinary ones: what ``--partial`` and the unsupported-node table
    show."""
    import torch

    class Special(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.proj(x)
            h = torch.floor(h * 4) / 4 + torch.i0(h).floor()
            return torch.sort(h, dim=-1).values.softmax(-1)

    torch.manual_seed(0)
    return Special().eval(), (torch.randn(tokens, width),)


def tiny_llama_masked(layers: int = 1, hidden: int = 128, seq: int = SEQ
                      ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``tiny_llama`` given its attention mask by keyword, the ``(model, args, kwargs)`` form
    of a factory: with the mask, its graph runs at any sequence length (``--dynamic``)."""
    import torch

    model, (ids,) = tiny_llama(layers, hidden, seq)
    return model, (ids,), {"attention_mask": torch.ones_like(ids)}
