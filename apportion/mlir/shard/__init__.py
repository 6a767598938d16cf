"""The sharding proposal's forms of a sharded program in upstream MLIR's ``shard`` dialect,
rendered from what the planner decided (``values``: the grid, every value's sharding as the
dialect says it, what each device runs), each verified by upstream MLIR 22 (the ``mlir``
extra) before it is returned:

* ``forms.annotated_mlir``: the user's annotations (form 1);
* ``forms.propagated_mlir``: every tensor's sharding after propagation or search (form 2);
* ``forms.partitioned_mlir``: the SPMD form with per-shard types and collectives (form 3);
* ``unrolled.unrolled_mlir``: the lowered ``MeshSchedule`` as one function per device (per
  distinct shard program) and a wrapper with the caller's signature that shards the inputs,
  runs the devices' functions and moves data between them, and puts the outputs back together
  (form 4, static mesh);
* ``dynamic.dynamic_mlir``: for a mesh with run-time axis sizes, one per-shard function per op
  with dynamic (``?``) split dims and a wrapper that reads the device count from the grid and
  loops over the run-time list of shards (form 5; ``dynamic.run_dynamic`` runs it).

The ops are ``linalg.generic`` on tensors (``body.py``), the form upstream's sharding
interface reads, so ``--sharding-propagation`` runs on form 1 and ``--shard-partition`` on
form 2; their scalar code is the MLIR layer's one table of bodies per kind (``mlir.bodies``),
the compute type its one rule (``mlir.types``), argmax keys its one packing (``mlir.keys``).
Like the rest of ``apportion.mlir`` it imports no planning pass, no sharding and no backend:
``apportion.sharding.forms`` builds the values from a plan and is where a plan's forms are
asked for (``apportion emit --mesh SPEC --shard-form FORM``).
"""
