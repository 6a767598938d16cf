"""Rewrites of the parallel IR that upstream MLIR's GPU lowering needs (the cuda backend runs
them between its passes): each ``#gpu.block`` mapping as the processor map
``--convert-parallel-loops-to-gpu`` reads (``block_maps``), every ``memref.copy`` as a
``linalg.copy`` a kernel can run (``copies_as_linalg``), the host's buffers as CUDA managed
memory (``host_shared``), and how many foralls carry a block mapping (``block_mapped``).

>>> block_mapped("%r = scf.forall (%i) in (4) {} {mapping = [#gpu.block<x>]}")
(1, 1)
"""

from __future__ import annotations

import re

_BLOCK = re.compile(r"#gpu\.block<(x|y|z|linear_dim_(\d+))>")
_PROCESSORS = {"x": "block_x", "y": "block_y", "z": "block_z"}


def block_maps(text: str) -> str:
    """Each ``#gpu.block`` mapping of a parallel loop as the processor map
    ``--convert-parallel-loops-to-gpu`` reads: ``x``, ``y``, ``z`` (and ``linear_dim_0`` to
    ``2``) to those block ids; a later linear dim to a loop in the block (``sequential``).

    >>> block_maps("{mapping = [#gpu.block<y>]}")
    '{mapping = [#gpu.loop_dim_map<processor = block_y, map = (d0) -> (d0), bound = (d0) -> (d0)>]}'
    """
    def one(m: re.Match[str]) -> str:
        linear = m.group(2)
        if linear is None:
            proc = _PROCESSORS[m.group(1)]
        else:
            proc = ("block_x", "block_y", "block_z")[int(linear)] if int(linear) < 3 else (
                "sequential")
        return f"#gpu.loop_dim_map<processor = {proc}, map = (d0) -> (d0), bound = (d0) -> (d0)>"

    return _BLOCK.sub(one, text)


_COPY = re.compile(r"^(\s*)memref\.copy (%[\w.$-]+), (%[\w.$-]+) : (.+?) to (.+)$", re.M)


def copies_as_linalg(text: str) -> str:
    """Every ``memref.copy`` a ``linalg.copy`` of the same operands, which becomes loops
    (a kernel cannot call the runner library's ``memrefCopy``).

    >>> copies_as_linalg("  memref.copy %a, %b : memref<4xf32> to memref<4xf32>")
    '  linalg.copy ins(%a : memref<4xf32>) outs(%b : memref<4xf32>)'
    """
    return _COPY.sub(r"\1linalg.copy ins(\2 : \4) outs(\3 : \5)", text)


_ALLOC = re.compile(r"^(\s*)(%[\w.$-]+) = memref\.alloc\(([^)]*)\)(?: \{[^}]*\})? : (.+)$")
_DEALLOC = re.compile(r"^(\s*)memref\.dealloc (%[\w.$-]+) : (.+)$")


def host_shared(text: str) -> str:
    """The host functions' buffers allocated as CUDA managed memory (``gpu.alloc
    host_shared``, which host code and kernels both read) and freed by ``gpu.dealloc`` (whose
    lowering wants a stream: an ``async`` one waited on). Buffers inside a ``gpu.module`` (a
    kernel's own) are left as they are: the device heap.

    >>> print(host_shared("    %a = memref.alloc() {alignment = 64 : i64} : memref<8xf32>"), end="")
        %a = gpu.alloc host_shared () : memref<8xf32>
    """
    out: list[str] = []
    kernel = False
    for line in text.splitlines():
        if line.startswith("  gpu.module "):
            kernel = True
        elif kernel and line == "  }":
            kernel = False
        alloc, dealloc = (None, None) if kernel else (_ALLOC.match(line), _DEALLOC.match(line))
        if alloc:
            pad, ssa, sizes, ty = alloc.groups()
            line = f"{pad}{ssa} = gpu.alloc host_shared ({sizes}) : {ty}"
        elif dealloc:
            pad, ssa, ty = dealloc.groups()
            k = len(out)  # a name the printer never gives
            out.append(f"{pad}%hs_wait{k} = gpu.wait async")
            out.append(f"{pad}%hs_free{k} = gpu.dealloc async [%hs_wait{k}] {ssa} : {ty}")
            line = f"{pad}gpu.wait [%hs_free{k}]"
        out.append(line)
    return "\n".join(out) + "\n"


def block_mapped(text: str) -> tuple[int, int]:
    """How many ``scf.forall`` ops ``text`` holds and how many of them carry a
    ``#gpu.block`` mapping (the others would run as host loops, not kernels).

    >>> block_mapped("scf.forall (%i) in (4) {} scf.forall (%j) in (2) {}")
    (2, 0)
    """
    return (len(re.findall(r"\bscf\.forall \(", text)),
            len(re.findall(r"\{mapping = \[#gpu\.block<", text)))
