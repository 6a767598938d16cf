"""The sharding proposal's forms of a sharded program in upstream MLIR's ``shard`` dialect,
each verified by upstream MLIR 22 (the ``mlir`` extra) before it is returned:

* ``annotated_mlir(program, mesh, annotations)``: the user's annotations (form 1);
* ``propagated_mlir(plan)``: every tensor's sharding after propagation or search (form 2);
* ``partitioned_mlir(plan)``: the SPMD form with per-shard types and collectives (form 3);
* ``unrolled_mlir(plan)``: one function per device (per distinct shard program) and a wrapper
  with the caller's signature that shards the inputs, runs the devices' functions and moves
  data between them, and puts the outputs back together (form 4, static mesh);
* ``dynamic_mlir(plan)``: for a mesh with run-time axis sizes, one per-shard function per op
  with dynamic (``?``) split dims and a wrapper that reads the device count from the grid and
  loops over the run-time list of shards (form 5; ``dynamic.run_dynamic`` runs it).

The ops are ``linalg.generic`` on tensors (``body.py``), the form upstream's sharding
interface reads, so ``--sharding-propagation`` runs on form 1 and ``--shard-partition`` on
form 2. This package sits above ``sharding`` (it reads plans) and the IREE backend's body
templates (one table of MLIR bodies per kind).
"""

from apportion.mlir.shard.dynamic import dynamic_mlir as dynamic_mlir
from apportion.mlir.shard.forms import annotated_mlir as annotated_mlir
from apportion.mlir.shard.forms import partitioned_mlir as partitioned_mlir
from apportion.mlir.shard.forms import propagated_mlir as propagated_mlir
from apportion.mlir.shard.unrolled import unrolled_mlir as unrolled_mlir

__all__ = ["annotated_mlir", "dynamic_mlir", "partitioned_mlir", "propagated_mlir", "unrolled_mlir"]
