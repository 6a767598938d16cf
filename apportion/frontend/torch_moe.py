"""Mixture-of-experts models from PyTorch: ``topk`` lowered to planned ops, and the expert
dispatch exported in a static-shaped, exact form (``one_hot``, which some routers use,
decomposes to a compare with an ``arange`` before lowering).

**topk** (``aten.topk``) becomes ``k`` rounds of planned ops along the selection dim, each a
reduction divided over the rows like any other: round ``r`` masks the elements taken so far,
takes the ``argmax`` of the rest (a row's first maximum), reads its value back with a ``max``
over a one-hot selection, and marks it taken; ``where`` ops stack the ``k`` rounds. The work is
``k`` passes over the row (``k`` is a router's top-k: 1 to 8 of a few dozen experts), against
a sort's ``n log n`` on one core. The rule the selection follows:

- values are torch's exactly; ``sorted=False`` still returns them sorted (torch leaves that
  order unspecified);
- ties go to the lower index (torch's CPU kernel picks among equal values in an order of its
  own; only the indices of tied values can differ from it);
- NaN is the largest value, as in torch: first when ``largest``, last otherwise;
- integers compare exactly (``largest=False`` orders by ``-1 - x``, which never overflows).

**Expert dispatch.** Hugging Face's experts modules (``@use_experts_implementation``: Mixtral,
Qwen2/3-MoE, OLMoE, DeepSeek, ...) loop over the experts hit, with data-dependent shapes
(``nonzero``, ``torch.where``, ``index_add_``) that ``torch.export`` cannot trace, or sort and
group tokens (``grouped_mm``: ``histc``, ``index_put``, a custom grouped matmul).
``static_experts(model)``, which ``from_torch`` enters around the export, swaps in
``dense_experts_forward`` for the export only: **every expert on every token, weighted by the
dense routing mask** (``[tokens, experts]``, the token's top-k weight where the expert was
chosen, zero elsewhere). It computes the same numbers: an expert a token did not choose adds
an exact zero (a ``where``, not a product, so an overflow there cannot make a NaN), and the
chosen ones add in expert order, as the eager loop's ``index_add_`` does. Its cost is the
price of static shapes: the experts' matmuls do ``experts / top_k`` times the work of the
tokens actually routed (``MoeBlock.dense_factor``); the router and the mask are a few
pointwise ops and reductions over ``[tokens, experts]``. The eager model keeps its own
implementation, which ``run --torch --check`` compares against.

``moe_blocks`` finds the experts modules of a model and ``moe_parts`` sorts a lowered program's
ops into router and expert work, for the model report.

This module imports torch only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import math
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.errors import ProgramError
from apportion.frontend.torch_lower import (
    Lowering,
    Origin,
    Value,
    dim_index,
    permute,
    slice_dim,
    squeeze,
    unsqueeze,
)
from apportion.frontend.torch_table import Ctx, Lower, registrar
from apportion.ir.dtypes import FLOAT_DTYPES

#: the dispatch form ``static_experts`` exports, as the model report names it
DENSE_FORM = "dense: every expert on every token, weighted by the routing mask"

_INT_MIN = {"int8": -(2 ** 7), "int32": -(2 ** 31), "int64": -(2 ** 63)}

#: ``aten.topk`` and ``aten.scatter.value`` -> their lowerings, merged into ``torch_aten``'s table
LOWERINGS: dict[str, Lower] = {}
aten = registrar(LOWERINGS)


# --- topk --------------------------------------------------------------------------------------

def _floor(dtype: str) -> float | int:
    """The least value of ``dtype``: what a taken element is masked with."""
    if dtype in FLOAT_DTYPES:
        return -math.inf
    if dtype not in _INT_MIN:
        raise ProgramError(f"topk of {dtype} is not supported; it takes floats and integers")
    return _INT_MIN[dtype]


def _stack(lw: Lowering, name: str, cols: Sequence[Value], part: str | None) -> Value:
    """``out[..., r] = cols[r][...]``: a ``where`` per column but the last, selecting by a
    constant one-hot row (as ``cat`` does)."""
    if len(cols) == 1:
        return unsqueeze(cols[0], -1)
    k, rows = len(cols), cols[0].shape
    r = len(rows)
    eye = lw.constant(f"{name}.slot", np.eye(k, dtype=bool), "bool")
    sizes, full, col_map = [*rows, k], list(range(r + 1)), list(range(r))
    acc: tuple[Value, list[int]] = (cols[-1], col_map)
    for c in range(k - 2, -1, -1):
        row = slice_dim(eye, 0, c, 1)
        assert row is not None, "a plain constant slices along any dim"
        last = c == 0
        out = lw.op("where", sizes, full, [(squeeze(row, [0]), [r]), (cols[c], col_map), acc],
                    part=part if last else f"{part or 'values'}.slot{c}")
        acc = (out, full)
    return acc[0]


def _free(lw: Lowering, taken: Value | None, nan: Value | None, p: str) -> Value:
    """Per element, 2 for an untaken number, 1 for an untaken NaN, 0 for a taken one (int32):
    its first maximum is the element to take when every key left is at the floor."""
    if nan is None:
        assert taken is not None
        return lw.cast(lw.elementwise("logical_not", [taken], part=f"{p}.free"), "int32")
    number = lw.cast(lw.elementwise("logical_not", [nan], part=f"{p}.number"), "int32")
    if taken is None:
        return number
    untaken = lw.cast(lw.elementwise("logical_not", [taken], part=f"{p}.free"), "int32")
    both = lw.elementwise("mul", [untaken, number], part=f"{p}.free_number")
    return lw.elementwise("add", [untaken, both], part=f"{p}.free_score")


def lower_topk(lw: Lowering, name: str, x: Value, k: int, dim: int = -1, largest: bool = True,
               sorted: bool = True) -> tuple[Value, Value]:
    """``torch.topk(x, k, dim, largest, sorted)`` as ``k`` rounds of planned reductions along
    ``dim`` (see the module docstring for the rule it follows on ties and NaN); ``name``
    names its constants.

    >>> lw = Lowering("demo")
    >>> x = lw.input("x", "float32", (16, 8))
    >>> values, indices = lower_topk(lw, "topk", x, 2)
    >>> values.shape, indices.dtype, sorted({o.kind.category.value for o in lw.ops})
    ((16, 2), 'int64', ['layout', 'pointwise', 'reduction'])
    """
    del sorted  # always sorted: torch leaves the order of sorted=False unspecified
    if x.rank == 0:
        x = unsqueeze(x, 0)
    d = dim_index(dim, x.rank)
    n = x.shape[d]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ProgramError(f"topk: k must be an int in 1..{n} (the size of dim {d}), got {k!r}")
    perm = [i for i in range(x.rank) if i != d] + [d]
    xv = permute(x, perm)  # the selection dim last: an index map, no op
    dt = x.dtype
    floor = lw.scalar(_floor(dt), dt)
    nan: Value | None = None  # where x is NaN, which largest=False takes last
    if largest:
        key = xv
    elif dt in FLOAT_DTYPES:  # -x, NaN at the floor with the taken ones
        neg = lw.elementwise("neg", [xv], part="neg")
        nan = lw.elementwise("ne", [xv, xv], part="nan")
        key = lw.elementwise("where", [nan, floor, neg], part="key")
    else:  # -1 - x reverses the order of every integer without overflow
        key = lw.elementwise("sub", [lw.scalar(-1, dt), xv], part="key")
    iota = lw.constant(f"{name}.iota", np.arange(n, dtype=np.int64), "int64")
    taken: Value | None = None
    values: list[Value] = []
    indices: list[Value] = []
    for r in range(k):
        p = f"r{r}"
        masked = key if taken is None else \
            lw.elementwise("where", [taken, floor, key], part=f"{p}.masked")
        idx = lw.reduce("argmax", masked, [-1], False, part=f"{p}.argmax")
        if taken is not None or nan is not None:
            # a row whose untaken keys are all at the floor (-inf) ties them with the taken
            # ones (and -inf with NaN, for largest=False): take its first untaken element then,
            # a number before a NaN
            top = lw.reduce("max", masked, [-1], False, part=f"{p}.max")
            at_floor = lw.elementwise("eq", [top, floor], part=f"{p}.at_floor")
            free = _free(lw, taken, nan, p)
            first_free = lw.reduce("argmax", free, [-1], False, part=f"{p}.first_free")
            idx = lw.elementwise("where", [at_floor, first_free, idx], part=f"{p}.index")
        hit = lw.elementwise("eq", [iota, unsqueeze(idx, -1)], part=f"{p}.hit")
        picked = lw.elementwise("where", [hit, xv, floor], part=f"{p}.pick")
        values.append(lw.reduce("max", picked, [-1], False, part=f"{p}.value"))
        indices.append(idx)
        if r < k - 1:
            taken = hit if taken is None else lw.elementwise("logical_or", [taken, hit],
                                                             part=f"{p}.taken")
    back = [perm.index(i) for i in range(x.rank)]
    return (permute(_stack(lw, name, values, None), back),
            permute(_stack(lw, name, indices, "indices"), back))


@aten("topk.default")
def _topk(cx: Ctx, x: Value, k: int, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> tuple[Value, Value]:
    values, indices = lower_topk(cx.lw, cx.node.name, x, k, dim, largest, sorted)
    if x.rank == 0:
        values, indices = squeeze(values), squeeze(indices)
    return values, indices


@aten("scatter.value")
def _scatter_value(cx: Ctx, x: Value, dim: int, index: Value, value: float | int | bool
                   ) -> Value:
    """``x.scatter(dim, index, value)``: ``value`` where some ``index[..., m, ...]`` along
    ``dim`` names the position, else ``x`` (routers' group and expert masks): a compare of
    every index with the positions, an ``any`` over them and a ``where``, all planned."""
    lw = cx.lw
    d = dim_index(dim, x.rank)
    if index.rank != x.rank or any(index.shape[e] != x.shape[e]
                                   for e in range(x.rank) if e != d):
        raise ProgramError(f"scatter along dim {d}: an index of shape {list(index.shape)} "
                           f"for a tensor of shape {list(x.shape)}; only an index as large as "
                           "the tensor in every other dim is supported")
    perm = [e for e in range(x.rank) if e != d] + [d]
    n = x.shape[d]
    positions = lw.constant(f"{cx.node.name}.positions", np.arange(n, dtype=np.int64),
                            "int64")
    idx = lw.cast(permute(index, perm), "int64")
    # torch wraps a negative index once (-1 is the last position)
    wrapped = lw.elementwise("remainder", [idx, lw.scalar(n, "int64")], part="wrap")
    hit = lw.elementwise("eq", [unsqueeze(wrapped, -1), positions], part="hit")  # [.., m, n]
    named = lw.reduce("any", hit, [-2], False, part="named")
    dt = cx.dtype()
    out = lw.elementwise("where", [named, cx.operand(value, dt), lw.cast(permute(x, perm), dt)])
    return permute(out, [perm.index(e) for e in range(x.rank)])


# --- the dense expert dispatch -----------------------------------------------------------------

def dense_experts_forward(self: Any, hidden_states: Any, top_k_index: Any,
                          top_k_weights: Any) -> Any:
    """A Hugging Face experts module's forward (``[tokens, hidden]``, the router's top-k
    indices and weights ``[tokens, k]``) in the dense form: every expert on every token, the
    results weighted by the dense routing mask and summed over the experts.

    >>> import torch
    >>> experts = tiny_mixtral()[0].model.layers[0].mlp.experts   # 4 experts, width 32
    >>> x, idx = torch.randn(5, 32), torch.tensor([[2, 0]] * 5)
    >>> w = torch.full((5, 2), 0.5)
    >>> bool(torch.allclose(dense_experts_forward(experts, x, idx, w), experts(x, idx, w)))
    True
    """
    import torch

    # the expert ids and a zero as tensors the module holds while exported: constants of the
    # program, where torch.arange and a Python 0 would be whole-tensor ops
    ids = getattr(self, "_apportion_ids", None)
    ids = torch.arange(self.num_experts) if ids is None else ids
    zero = getattr(self, "_apportion_zero", None)
    zero = torch.zeros(()) if zero is None else zero
    hit = top_k_index.unsqueeze(-1) == ids.to(top_k_index.device)  # [tokens, k, experts]
    routed = hit.any(dim=1).transpose(0, 1).unsqueeze(-1)  # [experts, tokens, 1]
    # each expert is chosen at most once per token: the sum adds one weight and zeros
    weight = torch.where(hit, top_k_weights.unsqueeze(-1), zero.to(top_k_weights.dtype))
    weight = weight.sum(dim=1)
    weight = weight.transpose(0, 1).unsqueeze(-1)  # [experts, tokens, 1]
    up = self.gate_up_proj if self.has_gate else self.up_proj
    up_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) \
        if self.has_bias else None
    out = _every_expert(hidden_states, up, up_bias, self.is_transposed)  # [experts, tokens, o]
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    out = _every_expert(out, self.down_proj, self.down_proj_bias if self.has_bias else None,
                        self.is_transposed)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    weighted = out * weight
    weighted = torch.where(routed, weighted, zero.to(weighted.dtype))
    return weighted.sum(dim=0).to(hidden_states.dtype)


def _every_expert(x: Any, weight: Any, bias: Any, transposed: bool) -> Any:
    """Every expert's linear layer on every token: ``x`` ``[tokens, in]`` (or ``[experts,
    tokens, in]``) by ``weight`` ``[experts, out, in]`` (``[experts, in, out]`` transposed)."""
    out = x @ (weight if transposed else weight.transpose(1, 2))  # [experts, tokens, out]
    return out if bias is None else out + bias.unsqueeze(1)


def _is_experts(module: Any) -> bool:
    """A Hugging Face experts module (``@use_experts_implementation`` sets these)."""
    return all(hasattr(module, a) for a in ("num_experts", "has_gate", "is_transposed",
                                            "down_proj", "_apply_gate"))


@contextlib.contextmanager
def static_experts(model: Any) -> Iterator[int]:
    """While it is entered, every experts module of ``model`` runs ``dense_experts_forward``
    (a forward of the instance's own, removed again on exit); yields how many it swapped.

    >>> import torch                                                     # doctest: +SKIP
    >>> with static_experts(model) as n:                                 # doctest: +SKIP
    ...     ep = torch.export.export(model, (ids,))
    """
    import torch

    swapped = []
    modules = model.modules() if hasattr(model, "modules") else ()
    try:
        for m in modules:
            if _is_experts(m) and "forward" not in vars(m):
                m.forward = types.MethodType(dense_experts_forward, m)
                m._apportion_ids = torch.arange(m.num_experts)
                m._apportion_zero = torch.zeros(())
                swapped.append(m)
        yield len(swapped)
    finally:
        for m in swapped:
            del m.forward, m._apportion_ids, m._apportion_zero


# --- the model report's view ---------------------------------------------------------------

@dataclass(frozen=True)
class MoeBlock:
    """One experts module of a model: its path (``model.layers.0.mlp.experts``), the block
    that holds it and its router (``...mlp``), and how many experts a token is routed to."""

    path: str
    block: str
    experts: int
    top_k: int

    @property
    def dense_factor(self) -> float:
        """The dense form's expert work over the work of the tokens actually routed."""
        return self.experts / self.top_k


def moe_blocks(model: Any) -> tuple[MoeBlock, ...]:
    """The experts modules of ``model`` (none for a model without them).

    >>> import torch                                                     # doctest: +SKIP
    >>> moe_blocks(tiny_mixtral()[0])                                    # doctest: +SKIP
    (MoeBlock(path='model.layers.0.mlp.experts', block='model.layers.0.mlp', experts=4, top_k=2),)
    """
    out = []
    named = model.named_modules() if hasattr(model, "named_modules") else ()
    for path, m in named:
        if not _is_experts(m):
            continue
        config = getattr(m, "config", None)
        top_k = getattr(config, "num_experts_per_tok", None) or getattr(config, "top_k", None)
        if not isinstance(top_k, int) or top_k < 1:
            continue  # no top-k to say what the tokens actually routed cost
        out.append(MoeBlock(path, path.rpartition(".")[0], int(m.num_experts), top_k))
    return tuple(out)


#: what Hugging Face calls a block's router module (its attribute name)
ROUTER_NAMES = ("gate", "router")

#: the parts of a mixture-of-experts block the report tells apart
PARTS = ("router", "experts", "shared")


def moe_parts(origins: Mapping[str, Origin], blocks: Sequence[MoeBlock]
              ) -> dict[str, tuple[str, MoeBlock]]:
    """Op name -> (part, block), ``part`` one of ``PARTS``: ``router`` (a module of the block
    that computes a ``topk``, or is called one of ``ROUTER_NAMES``: scores, softmax,
    selection, normalization), ``experts`` (the experts module: the dense dispatch) or
    ``shared`` (the rest of the block: shared experts and their gates, the sums); ops outside
    every block are not listed.

    >>> o = {"mm": Origin("mm", "aten.mm.default", module="l.0.mlp.gate"),
    ...      "topk": Origin("topk", "aten.topk.default", module="l.0.mlp.gate"),
    ...      "bmm": Origin("bmm", "aten.bmm.default", module="l.0.mlp.experts")}
    >>> {n: part for n, (part, _) in moe_parts(o, [MoeBlock("l.0.mlp.experts", "l.0.mlp", 4,
    ...                                                      2)]).items()}
    {'mm': 'router', 'topk': 'router', 'bmm': 'experts'}
    """
    routers = {o.module for o in origins.values() if o.target == "aten.topk.default" and o.module}
    routers |= {_join(b.block, name) for b in blocks for name in ROUTER_NAMES}
    out: dict[str, tuple[str, MoeBlock]] = {}
    for name, o in origins.items():
        module = o.module or ""
        for b in blocks:
            if not _within(module, b.block):
                continue
            if _within(module, b.path):
                out[name] = ("experts", b)
            elif any(_within(module, r) for r in routers if _within(r, b.block)):
                out[name] = ("router", b)
            else:
                out[name] = ("shared", b)
            break
    return out


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _within(module: str, path: str) -> bool:
    """``module`` is ``path`` or a submodule of it (every module is within the root, ``""``)."""
    return not path or module == path or module.startswith(path + ".")


# --- tiny models for tests, demos and --torch ---------------------------------------------------

def tiny_mixtral(tokens: int = 16, hidden: int = 32, experts: int = 4, top_k: int = 2,
                 layers: int = 1) -> tuple[Any, tuple[Any, ...]]:
    """A Mixtral from ``transformers`` (random weights, seeded): ``layers`` layers of width
    ``hidden``, ``experts`` experts, ``top_k`` per token, 4 heads and 2 KV heads, a
    vocabulary of 64; the form ``--torch apportion.frontend.torch_moe:tiny_mixtral`` takes."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=experts, num_experts_per_tok=top_k,
        max_position_embeddings=max(64, tokens), use_cache=False)
    model = transformers.MixtralForCausalLM(cfg).eval()
    return model, (torch.randint(0, cfg.vocab_size, (1, tokens)),)


def tiny_qwen2_moe(tokens: int = 16, hidden: int = 32, experts: int = 4, top_k: int = 2,
                   layers: int = 1) -> tuple[Any, tuple[Any, ...]]:
    """A Qwen2-MoE from ``transformers`` (random weights, seeded): a shared expert with its
    sigmoid gate beside ``experts`` routed experts, ``top_k`` per token, top-k probabilities
    renormalized; 4 heads, 2 KV heads, a vocabulary of 64."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
        moe_intermediate_size=hidden, shared_expert_intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True,
        max_position_embeddings=max(64, tokens), use_cache=False)
    model = transformers.Qwen2MoeForCausalLM(cfg).eval()
    return model, (torch.randint(0, cfg.vocab_size, (1, tokens)),)
