"""apportion: plans how tensor programs divide over the cores of multi-core accelerators.

>>> import apportion as ap
>>> A, B = ap.dim("A", 1024), ap.dim("B", 4096)
>>> with ap.program("double") as p:
...     x = p.input("x", [A, B], "float16")
...     p.output(x + x)
>>> ap.plan(p, target=ap.targets.spyre(cores=32)).plan.ops[0].cores
32
"""

from apportion import sharding as sharding
from apportion import strategies as strategies
from apportion import target as targets  # noqa: F401 (ap.targets: the target package)
from apportion.errors import ApportionError as ApportionError
from apportion.errors import CalibrationError as CalibrationError
from apportion.errors import EmitError as EmitError
from apportion.errors import ExecutionError as ExecutionError
from apportion.errors import PlanningError as PlanningError
from apportion.errors import ProgramError as ProgramError
from apportion.errors import TargetError as TargetError
from apportion.frontend.builder import Dim as Dim
from apportion.frontend.builder import Tensor as Tensor
from apportion.frontend.builder import dim as dim
from apportion.frontend.builder import hint as hint
from apportion.frontend.builder import matmul as matmul
from apportion.frontend.builder import program as program
from apportion.frontend.builder_ops import OP_FUNCTIONS as _OP_FUNCTIONS
from apportion.frontend.builder_ops import cast as cast
from apportion.frontend.json_format import dumps as dumps
from apportion.frontend.json_format import load as load
from apportion.frontend.json_format import loads as loads
from apportion.ir.program import Program as Program
from apportion.planned import PlannedProgram as PlannedProgram
from apportion.planned import plan as plan
from apportion.sharding.mesh import Mesh as Mesh
from apportion.sharding.spec import shard as shard
from apportion.target.host import set_measurer as _set_measurer
from apportion.target.target import Target as Target
from apportion.workflows.host_splitk import fingerprint as _fingerprint
from apportion.workflows.host_splitk import measure_host as _measure_host

# This host's split-K measurer and the digest of the code it times, for the ``cpu`` preset's
# table (``target/host.py``): the stock ``cpu`` target measures its table on first use on a
# machine (and code) whose table is not cached. The measurer plans and compiles with IREE, so it
# lives above the target package (``workflows/host_splitk.py``) and is registered here.
_set_measurer(_measure_host, _fingerprint)

# One builder function per op kind of the registry (``ap.exp``, ``ap.where``, ``ap.amax``, ...):
# adding a kind to ``apportion.ir.kinds`` adds its function here.
globals().update(_OP_FUNCTIONS)


#: names imported on first use: the PyTorch frontend and the torch.compile backend (torch itself
#: only when a model is lowered)
_LAZY = {"from_torch": "apportion.frontend.torch_export",
         "TorchProgram": "apportion.frontend.torch_program",
         "backend": "apportion.torch_compile"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'apportion' has no attribute {name!r}")
