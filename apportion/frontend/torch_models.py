"""Full-size Llama 3 models without weights, for planning a deployment from shapes alone.

Each factory builds a Hugging Face ``transformers`` Llama from its public config's sizes on
torch's ``meta`` device (tensors with a shape and a dtype, no storage) and returns ``(model,
example_inputs)``, the form ``--torch module:factory`` takes. ``from_torch`` lowers such a model
with its weights as program inputs that have shapes and dtypes only, so ``plan``, the model
report, ``emit`` and ``shard`` work, and ``run`` refuses, naming the weights it needs.

>>> model, (ids,) = llama3_tiny()                    # doctest: +SKIP
>>> ids.device.type, model.model.embed_tokens.weight.device.type  # doctest: +SKIP
('meta', 'meta')

On the command line: ``apportion plan --torch apportion.frontend.torch_models:llama3_8b``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["LLAMA3_70B", "LLAMA3_8B", "LlamaSizes", "llama3_70b", "llama3_8b", "llama3_tiny",
           "meta_llama"]

#: the token count of the full-size factories' example input
SEQ = 2048


@dataclass(frozen=True)
class LlamaSizes:
    """The sizes of a Llama config that shape its tensors (``transformers.LlamaConfig``)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 500000.0
    max_positions: int = 8192
    rms_eps: float = 1e-5


#: meta-llama/Meta-Llama-3-8B's config.json
LLAMA3_8B = LlamaSizes(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                       vocab=128256)
#: meta-llama/Meta-Llama-3-70B's config.json
LLAMA3_70B = LlamaSizes(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672,
                        vocab=128256)
#: a two-layer model of the same form for tests and demos (plans in about a second)
LLAMA3_TINY = LlamaSizes(hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512,
                         vocab=1000)


def meta_llama(sizes: LlamaSizes, seq: int = SEQ, dtype: str = "bfloat16",
               layers: int | None = None, device: str = "meta") -> tuple[Any, tuple[Any, ...]]:
    """A ``LlamaForCausalLM`` of ``sizes`` on the meta device in ``dtype`` (``bfloat16``, as
    the published weights are, or ``float16``/``float32``) and token ids ``[1, seq]`` on the
    meta device. ``layers`` overrides the layer count (the whole model by default); ``device``
    ``"cpu"`` builds it with random weights (seeded) and random ids instead.

    >>> model, (ids,) = meta_llama(LLAMA3_TINY, seq=8, layers=1)  # doctest: +SKIP
    >>> list(ids.shape), len(model.model.layers)                  # doctest: +SKIP
    ([1, 8], 1)
    """
    import torch
    import transformers

    if seq < 1:
        raise ValueError(f"seq must be >= 1, got {seq}")
    cfg = transformers.LlamaConfig(
        hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
        num_hidden_layers=sizes.layers if layers is None else layers,
        num_attention_heads=sizes.heads, num_key_value_heads=sizes.kv_heads,
        vocab_size=sizes.vocab, rope_theta=sizes.rope_theta, rms_norm_eps=sizes.rms_eps,
        max_position_embeddings=max(sizes.max_positions, seq), use_cache=False,
        tie_word_embeddings=False)
    torch_dtype = getattr(torch, dtype)
    torch.manual_seed(0)
    # built on the meta device: no weight is allocated (a 70B model would need 140 GB)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg).to(torch_dtype).eval()
        ids = torch.randint(0, sizes.vocab, (1, seq))
    return model, (ids,)


def llama3_8b(seq: int = SEQ) -> tuple[Any, tuple[Any, ...]]:
    """Llama-3-8B (hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocab
    128256, rope theta 500000) in bfloat16 on the meta device, at ``seq`` tokens."""
    return meta_llama(LLAMA3_8B, seq)


def llama3_70b(seq: int = SEQ) -> tuple[Any, tuple[Any, ...]]:
    """Llama-3-70B (hidden 8192, 80 layers, 64 heads, 8 KV heads, intermediate 28672, vocab
    128256, rope theta 500000) in bfloat16 on the meta device, at ``seq`` tokens."""
    return meta_llama(LLAMA3_70B, seq)


def llama3_tiny(seq: int = 16) -> tuple[Any, tuple[Any, ...]]:
    """A two-layer Llama 3 of width 256 (4 heads, 2 KV heads) in float32 on the meta device:
    the full-size factories' form at a size that plans in about a second."""
    return meta_llama(LLAMA3_TINY, seq, dtype="float32")
