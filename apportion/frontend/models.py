"""Transformer programs built from the model configurations of ``models.json``.

The benchmarks and the built-in default program use these: linear layers, attention matmuls,
norms and softmax of real models at prefill and decode token counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from apportion.errors import ProgramError
from apportion.frontend.json_format import from_dict
from apportion.ir.program import LoopLevel, Program, TilingGroup


def load_models(path: str | Path | None = None) -> dict[str, Any]:
    """The models document (the packaged copy unless ``path`` is given)."""
    if path is None:
        text = resources.files("apportion.frontend").joinpath("data/models.json").read_text()
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, ValueError) as e:  # ValueError: not UTF-8, or a NUL byte in the path
            why = getattr(e, "strerror", None) or e
            raise ProgramError(f"cannot read models file {str(path)!r}: {why}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProgramError(f"models file {str(path)!r} is not valid JSON: {e.msg} at line "
                           f"{e.lineno}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise ProgramError(f"models file {str(path)!r}: expected an object with a \"models\" "
                           "table of model configurations")
    return doc


@dataclass(frozen=True)
class OpCase:
    """One benchmark op: a one-op program and what it is."""

    model: str
    phase: str  # "prefill" or "decode"
    tokens: int
    what: str
    program: Program


def _prog(name: str, tensors: dict[str, tuple[list[int], str]], ops: list[dict[str, Any]],
          outputs: list[str]) -> Program:
    return from_dict({
        "name": name,
        "tensors": {t: {"shape": s, "dtype": dt} for t, (s, dt) in tensors.items()},
        "inputs": list(tensors), "outputs": outputs, "ops": ops,
    })


def linear(name: str, tokens: int, k: int, n: int, dtype: str) -> Program:
    """``y[t, n] = x[t, k] @ w[k, n]``."""
    return _prog(name, {"x": ([tokens, k], dtype), "w": ([k, n], dtype)},
                 [{"name": name, "op": "matmul", "out": "y[t,n]", "ins": ["x[t,k]", "w[k,n]"]}],
                 ["y"])


def token_ops(cfg: dict[str, Any], tokens: int, dtype: str) -> list[tuple[str, Program]]:
    """The op shapes of one decoder block that scale with tokens: linears and the norm."""
    h, f, heads, kvh, hd = (cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["kv_heads"],
                            cfg["head_dim"])
    return [
        ("qkv", linear("qkv", tokens, h, (heads + 2 * kvh) * hd, dtype)),
        ("o_proj", linear("o_proj", tokens, heads * hd, h, dtype)),
        ("up", linear("up", tokens, h, 2 * f if cfg.get("gated_mlp") else f, dtype)),
        ("down", linear("down", tokens, f, h, dtype)),
        ("lm_head", linear("lm_head", tokens, h, cfg["vocab"], dtype)),
        ("norm_stat", _prog(
            "norm_stat", {"x": ([tokens, h], dtype)},
            [{"name": "norm_stat", "op": "mean", "out": "r[t,0]", "ins": ["x[t,n]"]}], ["r"])),
        ("norm_scale", _prog(
            "norm_scale", {"x": ([tokens, h], dtype), "r": ([tokens, 1], dtype)},
            [{"name": "norm_scale", "op": "mul", "out": "y[t,n]", "ins": ["x[t,n]", "r[t,0]"]}],
            ["y"])),
    ]


def attention_ops(cfg: dict[str, Any], tokens: int, context: int, dtype: str
                  ) -> list[tuple[str, Program]]:
    """Attention matmuls and softmax: ``tokens`` queries over ``context`` keys, per head."""
    heads, hd = cfg["heads"], cfg["head_dim"]
    out: list[tuple[str, Program]] = []
    out.append(("scores", _prog(
        "scores", {"q": ([heads, tokens, hd], dtype), "kc": ([heads, context, hd], dtype)},
        [{"name": "scores", "op": "matmul", "out": "s[b,t,c]", "ins": ["q[b,t,d]", "kc[b,c,d]"]}],
        ["s"])))
    out.append(("attn_v", _prog(
        "attn_v", {"p": ([heads, tokens, context], dtype), "v": ([heads, context, hd], dtype)},
        [{"name": "attn_v", "op": "matmul", "out": "o[b,t,d]", "ins": ["p[b,t,c]", "v[b,c,d]"]}],
        ["o"])))
    out.append(("softmax_max", _prog(
        "softmax_max", {"s": ([heads, tokens, context], dtype)},
        [{"name": "softmax_max", "op": "max", "out": "r[b,t,0]", "ins": ["s[b,t,c]"]}], ["r"])))
    out.append(("softmax_exp", _prog(
        "softmax_exp", {"s": ([heads, tokens, context], dtype), "r": ([heads, tokens, 1], dtype)},
        [{"name": "softmax_exp", "op": "sub", "out": "e[b,t,c]", "ins": ["s[b,t,c]", "r[b,t,0]"]}],
        ["e"])))
    return out


def bench_cases(models: dict[str, Any], dtype: str = "float16") -> list[OpCase]:
    """Every op shape of every model at every prefill and decode token count."""
    cases = []
    for name, cfg in models["models"].items():
        for t in models["prefill_tokens"]:
            for what, prog in token_ops(cfg, t, dtype) + attention_ops(cfg, t, t, dtype):
                cases.append(OpCase(name, "prefill", t, what, prog))
        for b in models["decode_batch"]:
            for what, prog in token_ops(cfg, b, dtype):
                cases.append(OpCase(name, "decode", b, what, prog))
            for ctx in models["decode_context"]:
                for what, prog in attention_ops(cfg, b, ctx, dtype):
                    cases.append(OpCase(name, "decode", b, f"{what}@{ctx}", prog))
    return cases


def default_program(model: str = "llama3-8b", tokens: int = 128, dtype: str = "float16"
                    ) -> Program:
    """The built-in default: one decoder block's MLP of ``model`` (RMS norm, gated MLP)."""
    cfg = load_models()["models"].get(model)
    if cfg is None:
        raise ProgramError(f"unknown model {model!r}; valid: {', '.join(load_models()['models'])}")
    h, f = cfg["hidden"], cfg["ffn"]
    act = cfg.get("act", "silu")
    ops: list[dict[str, Any]] = [
        {"name": "sq", "op": "mul", "out": "sq[t,n]", "ins": ["x[t,n]", "x[t,n]"]},
        {"name": "ms", "op": "mean", "out": "ms[t,0]", "ins": ["sq[t,n]"]},
        {"name": "inv", "op": "rsqrt", "out": "inv[t,0]", "ins": ["ms[t,0]"]},
        {"name": "norm", "op": "mul", "out": "xn[t,n]", "ins": ["x[t,n]", "inv[t,0]"]},
        {"name": "gate", "op": "matmul", "out": "g[t,f]", "ins": ["xn[t,n]", "wg[n,f]"]},
        {"name": "up", "op": "matmul", "out": "u[t,f]", "ins": ["xn[t,n]", "wu[n,f]"]},
        {"name": "act", "op": act, "out": "a[t,f]", "ins": ["g[t,f]"]},
        {"name": "glu", "op": "mul", "out": "hh[t,f]", "ins": ["a[t,f]", "u[t,f]"]},
        {"name": "down", "op": "matmul", "out": "y[t,n]", "ins": ["hh[t,f]", "wd[f,n]"]},
    ]
    return _prog(f"{model}-mlp-{tokens}",
                 {"x": ([tokens, h], dtype), "wg": ([h, f], dtype), "wu": ([h, f], dtype),
                  "wd": ([f, h], dtype)}, ops, ["y"])


def default_tiling(program: Program) -> Program:
    """The default program with its norm and its MLP each one loop group over tokens.

    The counts are 1: ``auto_tile`` picks the smallest that fits the scratchpad.
    """
    names = [o.name for o in program.ops]
    groups = (TilingGroup(tuple(names[:4]), (LoopLevel(1, ("t",)),)),
              TilingGroup(tuple(names[4:]), (LoopLevel(1, ("t",)),)))
    return replace(program, tiling=groups)
