"""A block's work split over the block's threads: each GPU-mapped ``scf.forall`` of the parallel
IR (a core of the plan, a block) gets a nested ``scf.forall`` over ``threads`` threads
(``#gpu.thread<x>``), made by upstream MLIR's transform dialect.

Per block forall, the op whose result the block writes (the value of its
``tensor.parallel_insert_slice``) is tiled over the threads along its last parallel dim (the
innermost: neighbouring threads read neighbouring elements) with
``transform.structured.tile_using_forall``, and every other ``linalg`` op of the block (fills,
the accumulations a finish reads) is fused into that thread loop, producer after producer
(``fuse_into_containing_op``: each thread computes the slice of a producer its tile reads). A
block where that leaves any ``linalg`` op or buffer outside the thread loop keeps one thread:
its threads would otherwise all run that op on one buffer. ``barriers`` then puts a
``gpu.barrier`` after each thread loop, for a thread loop in a loop of the block whose next
iteration reads what other threads wrote.

The tagging (``apportion.group``, ``apportion.last``, ``apportion.producer``: discardable
attributes on the ``linalg`` ops) names the ops a block's transform script matches.

>>> from apportion.mlir import upstream
>>> text = '''func.func @twice(%x: tensor<64x32xf32>) -> tensor<64x32xf32> {
...   %e = tensor.empty() : tensor<64x32xf32>
...   %r = scf.forall (%b) in (4) shared_outs(%o = %e) -> (tensor<64x32xf32>) {
...     %off = affine.apply affine_map<(d0) -> (d0 * 16)>(%b)
...     %xs = tensor.extract_slice %x[%off, 0] [16, 32] [1, 1]
...         : tensor<64x32xf32> to tensor<16x32xf32>
...     %os = tensor.extract_slice %o[%off, 0] [16, 32] [1, 1]
...         : tensor<64x32xf32> to tensor<16x32xf32>
...     %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>,
...         affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
...         ins(%xs : tensor<16x32xf32>) outs(%os : tensor<16x32xf32>) {
...     ^bb0(%in: f32, %out: f32):
...       %d = arith.addf %in, %in : f32
...       linalg.yield %d : f32
...     } -> tensor<16x32xf32>
...     scf.forall.in_parallel {
...       tensor.parallel_insert_slice %y into %o[%off, 0] [16, 32] [1, 1]
...           : tensor<16x32xf32> into tensor<64x32xf32>
...     }
...   } {mapping = [#gpu.block<x>]}
...   return %r : tensor<64x32xf32>
... }'''
>>> if upstream.available():
...     split = thread_tiles(text, 8)
...     assert split.blocks == 1 and split.threaded == 1
...     assert "{mapping = [#gpu.thread<x>]}" in split.text
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from apportion.errors import EmitError
from apportion.mlir import upstream

_FORALL = re.compile(r"= scf\.forall \(")
_PARALLEL = re.compile(r"^\s*scf\.parallel \(")
_RESULT = re.compile(r"^\s*(%[\w.$-]+)(?::\d+)? = ")
_ITERATORS = re.compile(r'"(parallel|reduction)"')


@dataclass(frozen=True)
class ThreadSplit:
    """The IR with blocks split over threads, its block foralls and how many were split."""

    text: str
    blocks: int
    threaded: int


def block_spans(lines: list[str], opener: re.Pattern[str] = _FORALL) -> list[tuple[int, int]]:
    """The first and last line of each GPU-block-mapped loop of printed IR: ``scf.forall``
    (on tensors) or, with ``opener=_PARALLEL``, ``scf.parallel`` (on memrefs)."""
    spans = []
    for i, line in enumerate(lines):
        if not opener.search(line):
            continue
        pad = " " * (len(line) - len(line.lstrip()))
        for j in range(i + 1, len(lines)):
            if lines[j].startswith(pad + "}") and "#gpu.block<" in lines[j]:
                spans.append((i, j))
                break
            if lines[j].startswith(pad + "}"):
                break  # a forall of another mapping (or none)
    return spans


def _tag(lines: list[str], group: int, first: int, last: int) -> None:
    """Tag the linalg ops of one block forall: the written one ``apportion.last = DIM`` (its
    last parallel dim), the others ``apportion.producer = LINE``."""
    body = "\n".join(lines[first:last + 1])
    written = set(re.findall(r"tensor\.parallel_insert_slice (%[\w.$-]+) into", body))
    for k in range(first, last + 1):
        line = lines[k]
        result = _RESULT.match(line)
        if "linalg.fill ins(" in line:
            lines[k] = line.replace("linalg.fill ins(", "linalg.fill {apportion.group = "
                                    f"{group} : i64, apportion.producer = {k} : i64}} ins(", 1)
        elif "linalg.generic {" in line and result:
            its = _ITERATORS.findall(line)
            parallel = [d for d, it in enumerate(its) if it == "parallel"]
            tag = f"apportion.group = {group} : i64"
            if result.group(1) in written and parallel:
                tag += f", apportion.last = {parallel[-1]} : i64"
            else:
                tag += f", apportion.producer = {k} : i64"
            lines[k] = re.sub(r"(linalg\.generic \{.*?iterator_types = \[[^\]]*\])",
                              lambda m, t=tag: f"{m.group(1)}, {t}", line, count=1)


def _script(group: int, dim: int, producers: list[int], threads: int) -> str:
    counts = ", ".join(["0"] * dim + [str(threads)])
    op = "!transform.any_op"
    out = ["module attributes {transform.with_named_sequence} {",
           f"  transform.named_sequence @__transform_main(%root: {op} {{transform.readonly}}) {{",
           f'    %last = transform.structured.match ops{{["linalg.generic"]}} attributes'
           f"{{apportion.group = {group} : i64, apportion.last = {dim} : i64}} in %root "
           f": ({op}) -> {op}",
           f"    %t, %f0 = transform.structured.tile_using_forall %last num_threads [{counts}] "
           f"(mapping = [#gpu.thread<x>]) : ({op}) -> ({op}, {op})"]
    for n, k in enumerate(sorted(producers, reverse=True)):  # the last producer first
        out.append(f"    %p{k} = transform.structured.match interface{{LinalgOp}} attributes"
                   f"{{apportion.producer = {k} : i64}} in %root : ({op}) -> {op}")
        out.append(f"    %u{k}, %f{n + 1} = transform.structured.fuse_into_containing_op %p{k} "
                   f"into %f{n} : ({op}, {op}) -> ({op}, {op})")
    # a fused producer's destination: a slice of a block-wide empty tensor becomes an empty
    # tensor of the slice, in the thread's loop
    out += ["    %fn = transform.structured.match ops{[\"func.func\"]} in %root "
            f": ({op}) -> {op}",
            "    transform.apply_patterns to %fn {",
            "      transform.apply_patterns.tensor.fold_tensor_empty",
            f"    }} : {op}",
            "    transform.yield", "  }", "}"]
    return "\n".join(out) + "\n"


def _alone(text: str, group: int) -> bool:
    """Whether block forall ``group``'s work is all inside its thread loop (nothing a block's
    threads would each run on one buffer)."""
    lines = text.splitlines()
    spans = block_spans(lines)
    if group >= len(spans):
        return False
    first, last = spans[group]
    depth_pad: str | None = None
    for line in lines[first + 1:last]:
        if depth_pad is not None:
            if line.startswith(depth_pad + "}"):
                if "#gpu.thread<" not in line:
                    return False  # a nested forall of another mapping
                depth_pad = None
            continue
        if _FORALL.search(line):
            depth_pad = " " * (len(line) - len(line.lstrip()))
            continue
        if "linalg." in line or "tensor.empty" in line or "bufferization.alloc" in line:
            return False
    return True


def shared_by_threads(loops: str) -> set[int]:
    """The blocks of ``loops`` (the IR on memrefs, foralls now ``scf.parallel``) whose
    threads would each run an op on one buffer: a block with a thread loop that also
    allocates, copies or runs a ``linalg`` op outside it (bufferization copies a slice the
    block both reads and writes into a buffer of its own, which each GPU thread would hold).

    >>> shared_by_threads('''    scf.parallel (%b) = (%c0) to (%c4) step (%c1) {
    ...       %a = memref.alloc() : memref<4xf32>
    ...       scf.parallel (%t) = (%c0) to (%c8) step (%c1) {
    ...       } {mapping = [#gpu.thread<x>]}
    ...     } {mapping = [#gpu.block<x>]}''')
    {0}
    """
    lines = loops.splitlines()
    out = set()
    for g, (first, last) in enumerate(block_spans(lines, _PARALLEL)):
        inner: str | None = None
        threaded = outside = False
        for line in lines[first + 1:last]:
            if inner is not None:
                if line.startswith(inner + "}"):
                    threaded, inner = threaded or "#gpu.thread<" in line, None
                continue
            if _PARALLEL.search(line):
                inner = " " * (len(line) - len(line.lstrip()))
            elif re.search(r"memref\.(alloc|copy)\b|linalg\.", line):
                outside = True
        if threaded and outside:
            out.add(g)
    return out


def thread_tiles(text: str, threads: int, keep: frozenset[int] = frozenset()) -> ThreadSplit:
    """``text`` (parallel IR on tensors, foralls mapped to GPU blocks) with each block's work
    split over ``threads`` threads where that is safe (see the module docstring); the blocks
    numbered in ``keep`` keep one thread."""
    # a block's result computed into its slice of the shared output, not into a fresh tensor
    # copied there (which each thread would hold whole); printed as upstream prints: an op a
    # line
    lines = upstream.mlir_opt(text, ["--eliminate-empty-tensors"]).splitlines()
    spans = block_spans(lines)
    for g, (first, last) in enumerate(spans):
        if g not in keep:
            _tag(lines, g, first, last)
    current = "\n".join(lines) + "\n"
    threaded = 0
    with tempfile.TemporaryDirectory() as tmp:
        for g in range(len(spans)):
            found = re.search(rf"apportion\.group = {g} : i64, apportion\.last = (\d+) : i64",
                              current)
            if found is None:
                continue  # the block writes nothing a parallel dim splits
            producers = [int(k) for k in re.findall(
                rf"apportion\.group = {g} : i64, apportion\.producer = (\d+) : i64", current)]
            library = Path(tmp) / f"block{g}.mlir"
            library.write_text(_script(g, int(found.group(1)), producers, threads))
            try:
                split = upstream.mlir_opt(current, [
                    "--pass-pipeline=builtin.module(transform-preload-library"
                    f"{{transform-library-paths={library}}}, transform-interpreter, "
                    "canonicalize, cse)"])
                # tiling a run-time size can print a map upstream's parser refuses as
                # non-affine ("at least one of the multiply operands has to be either a
                # constant or symbolic"): such a split is not kept
                upstream.mlir_opt(split)
            except EmitError:
                continue  # a producer that does not fuse: the block keeps one thread
            if _alone(split, g):
                current, threaded = split, threaded + 1
    return ThreadSplit(current, len(spans), threaded)


_THREAD = re.compile(r"#gpu\.thread<x>")
_THREAD_MAP = ("#gpu.loop_dim_map<processor = thread_x, map = (d0) -> (d0), "
               "bound = (d0) -> (d0)>")


def thread_maps(text: str) -> str:
    """Each thread mapping of a parallel loop as the processor map
    ``--convert-parallel-loops-to-gpu`` reads.

    >>> print(thread_maps("  } {mapping = [#gpu.thread<x>]}").replace(", map", ",\\n    map"))
      } {mapping = [#gpu.loop_dim_map<processor = thread_x,
        map = (d0) -> (d0), bound = (d0) -> (d0)>]}
    """
    return _THREAD.sub(_THREAD_MAP, text)


def barriers(text: str) -> str:
    """A ``gpu.barrier`` after each loop mapped to threads (``thread_maps``'s), so what the
    block's threads wrote is there for all of them after it. (After buffer deallocation,
    whose analysis refuses the barrier's unknown memory effects.)

    >>> print(barriers("    } {mapping = [#gpu.loop_dim_map<processor = thread_x>]}"))
        } {mapping = [#gpu.loop_dim_map<processor = thread_x>]}
        gpu.barrier
    """
    out = []
    for line in text.splitlines():
        out.append(line)
        if line.lstrip().startswith("}") and "processor = thread_x" in line:
            out.append(" " * (len(line) - len(line.lstrip())) + "gpu.barrier")
    return "\n".join(out)
