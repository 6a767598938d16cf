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
from apportion.ir import jsondoc
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
        doc = jsondoc.loads(text, ProgramError, f"models file {str(path)!r}")
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


def forward_program(model: str, layers: int, tokens: int, dtype: str = "float16",
                    models: dict[str, Any] | None = None) -> Program:
    """The whole forward pass of ``model`` at prefill: ``layers`` decoder blocks over
    ``tokens`` tokens (self-attention over as many keys), then the final norm and ``lm_head``.

    Per block (llama-style; ``norm``, ``act`` and ``gated_mlp`` of the configuration apply):

    * norm: RMS (``mul`` of x by itself, ``mean``, ``rsqrt``, ``mul``) or layer norm (``mean``,
      ``sub``, ``square``, ``mean``, ``rsqrt``, ``mul``), then its gain (``mul`` by a weight);
    * q, k, v projections (``matmul``);
    * attention scores of every head in one ``matmul`` that reads the heads' columns through
      index sums, ``s[h,t,c] = q[t,128*h+d] . k[c,128*h+d]`` (as ``examples/attention.json``),
      scaled by ``1/sqrt(head_dim)`` (a ``mul`` by the one-element input ``scale``);
    * softmax over the keys (``max``, ``sub``, ``exp``, ``sum``, ``div``), no causal mask;
    * attention times V, ``o[h,t,d] = p[h,t,c] . v[c,128*h+d]``, and the output projection,
      ``o[h,t,d] . wo[128*h+d,n]`` (a matmul reducing over ``h`` and ``d``);
    * residual ``add``; the second norm; the MLP: ``gate``, ``up``, the activation, their
      ``mul``, ``down`` (plain: ``up``, the activation, ``down``); residual ``add``.

    Grouped-query attention (``kv_heads < heads``, ``g = heads / kv_heads`` query heads per
    K/V head) needs no copy of K and V: the head dim splits into the K/V head ``a`` and the
    member ``r`` of its group, and every index stays affine, ``s[a,r,t,c] =
    q[t,(g*128)*a+128*r+d] . k[c,128*a+d]`` (the IR has no ``h // g``, and needs none).

    Names: every op and tensor of block ``i`` starts with ``l{i}_``; the input is ``x``, the
    output ``logits``. llama2-7b with 32 layers has 32 x 29 + 6 = 934 ops.

    >>> p = forward_program("llama2-7b", 2, 16)
    >>> len(p.ops), p.ops[8].name, str(p.ops[8].ins[0])
    (64, 'l0_scores', 'l0_q[t, 128*h+d]')
    """
    doc = models if models is not None else load_models()
    cfg = doc["models"].get(model)
    if cfg is None:
        raise ProgramError(f"unknown model {model!r}; valid: {', '.join(doc['models'])}")
    for what, n in (("layers", layers), ("tokens", tokens)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ProgramError(f"forward program of {model!r}: {what} must be a positive int, "
                               f"got {n!r}")
    hid, ffn, heads, kvh, hd = (cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["kv_heads"],
                                cfg["head_dim"])
    if kvh < 1 or heads % kvh:
        raise ProgramError(f"model {model!r}: {heads} heads are not a multiple of its {kvh} "
                           "K/V heads")
    group = heads // kvh
    act, gated, layer_norm = cfg.get("act", "silu"), cfg.get("gated_mlp"), \
        cfg.get("norm") == "layer"
    tensors: dict[str, tuple[list[int], str]] = {"x": ([tokens, hid], dtype),
                                                 "scale": ([1], dtype)}
    ops: list[dict[str, Any]] = []

    def op(name: str, fn: str, out: str, *ins: str, **dims: int) -> str:
        ops.append({"name": name, "op": fn, "out": out, "ins": list(ins),
                    **({"dims": dims} if dims else {})})
        return out.split("[")[0]

    def weight(name: str, shape: list[int]) -> str:
        tensors[name] = (shape, dtype)
        return name

    def norm(p: str, x: str) -> str:
        g = weight(f"{p}g", [1, hid])
        if layer_norm:
            mu = op(f"{p}mu", "mean", f"{p}mu[t,0]", f"{x}[t,n]")
            xc = op(f"{p}xc", "sub", f"{p}xc[t,n]", f"{x}[t,n]", f"{mu}[t,0]")
            sq = op(f"{p}sq", "square", f"{p}sq[t,n]", f"{xc}[t,n]")
            var = op(f"{p}var", "mean", f"{p}var[t,0]", f"{sq}[t,n]")
            inv = op(f"{p}inv", "rsqrt", f"{p}inv[t,0]", f"{var}[t,0]")
            xn = op(f"{p}xn", "mul", f"{p}xn[t,n]", f"{xc}[t,n]", f"{inv}[t,0]")
        else:
            sq = op(f"{p}sq", "mul", f"{p}sq[t,n]", f"{x}[t,n]", f"{x}[t,n]")
            ms = op(f"{p}ms", "mean", f"{p}ms[t,0]", f"{sq}[t,n]")
            inv = op(f"{p}inv", "rsqrt", f"{p}inv[t,0]", f"{ms}[t,0]")
            xn = op(f"{p}xn", "mul", f"{p}xn[t,n]", f"{x}[t,n]", f"{inv}[t,0]")
        return op(f"{p}gain", "mul", f"{p}out[t,n]", f"{xn}[t,n]", f"{g}[0,n]")

    def linear(name: str, x: str, w: str) -> str:
        return op(name, "matmul", f"{name}[t,j]", f"{x}[t,n]", f"{w}[n,j]")

    if group == 1:  # one index letter for the head: h
        heads_at, q_col, kv_col, hdims = "h", f"{hd}*h+d", f"{hd}*h+d", {"h": heads}
    else:  # the K/V head a and the member r of its group
        heads_at, q_col, kv_col = "a,r", f"{group * hd}*a+{hd}*r+d", f"{hd}*a+d"
        hdims = {"a": kvh, "r": group}
    x = "x"
    for i in range(layers):
        p = f"l{i}_"
        xn = norm(f"{p}attn_", x)
        q = linear(f"{p}q", xn, weight(f"{p}wq", [hid, heads * hd]))
        k = linear(f"{p}k", xn, weight(f"{p}wk", [hid, kvh * hd]))
        v = linear(f"{p}v", xn, weight(f"{p}wv", [hid, kvh * hd]))
        hs = f"{heads_at},t"
        s = op(f"{p}scores", "matmul", f"{p}s[{hs},c]", f"{q}[t,{q_col}]", f"{k}[c,{kv_col}]",
               **hdims, d=hd)
        ss = op(f"{p}scale", "mul", f"{p}ss[{hs},c]", f"{s}[{hs},c]", "scale[0]")
        mx = op(f"{p}smax", "max", f"{p}mx[{hs},0]", f"{ss}[{hs},c]")
        sh = op(f"{p}shift", "sub", f"{p}sh[{hs},c]", f"{ss}[{hs},c]", f"{mx}[{hs},0]")
        ex = op(f"{p}exp", "exp", f"{p}ex[{hs},c]", f"{sh}[{hs},c]")
        den = op(f"{p}den", "sum", f"{p}den[{hs},0]", f"{ex}[{hs},c]")
        pr = op(f"{p}probs", "div", f"{p}p[{hs},c]", f"{ex}[{hs},c]", f"{den}[{hs},0]")
        o = op(f"{p}pv", "matmul", f"{p}o[{hs},d]", f"{pr}[{hs},c]", f"{v}[c,{kv_col}]",
               d=hd)
        wo = weight(f"{p}wo", [heads * hd, hid])
        a = op(f"{p}o_proj", "matmul", f"{p}a[t,n]", f"{o}[{hs},d]", f"{wo}[{q_col},n]")
        r = op(f"{p}res1", "add", f"{p}r[t,n]", f"{x}[t,n]", f"{a}[t,n]")
        xn2 = norm(f"{p}mlp_", r)
        if gated:
            g = op(f"{p}gate", "matmul", f"{p}g[t,f]", f"{xn2}[t,n]",
                   f"{weight(f'{p}wg', [hid, ffn])}[n,f]")
            u = op(f"{p}up", "matmul", f"{p}u[t,f]", f"{xn2}[t,n]",
                   f"{weight(f'{p}wu', [hid, ffn])}[n,f]")
            ac = op(f"{p}act", act, f"{p}ac[t,f]", f"{g}[t,f]")
            m = op(f"{p}glu", "mul", f"{p}m[t,f]", f"{ac}[t,f]", f"{u}[t,f]")
        else:
            u = op(f"{p}up", "matmul", f"{p}u[t,f]", f"{xn2}[t,n]",
                   f"{weight(f'{p}wu', [hid, ffn])}[n,f]")
            m = op(f"{p}act", act, f"{p}m[t,f]", f"{u}[t,f]")
        y = op(f"{p}down", "matmul", f"{p}y[t,n]", f"{m}[t,f]",
               f"{weight(f'{p}wd', [ffn, hid])}[f,n]")
        x = op(f"{p}res2", "add", f"{p}out[t,n]", f"{r}[t,n]", f"{y}[t,n]")
    xf = norm("final_", x)
    op("lm_head", "matmul", "logits[t,v]", f"{xf}[t,n]",
       f"{weight('w_lm', [hid, cfg['vocab']])}[n,v]")
    return _prog(f"{model}-forward-{layers}x{tokens}", tensors, ops, ["logits"])
