"""apportion: plans how tensor programs divide over the cores of multi-core accelerators.

>>> import apportion as ap
>>> A, B = ap.dim("A", 1024), ap.dim("B", 4096)
>>> with ap.program("double") as p:
...     x = p.input("x", [A, B], "float16")
...     p.output(x + x)
>>> ap.plan(p, target=ap.targets.spyre(cores=32)).plan.ops[0].cores
32
"""

from apportion import targets as targets
from apportion.errors import ApportionError as ApportionError
from apportion.errors import ExecutionError as ExecutionError
from apportion.errors import PlanningError as PlanningError
from apportion.errors import ProgramError as ProgramError
from apportion.errors import TargetError as TargetError
from apportion.frontend.builder import Dim as Dim
from apportion.frontend.builder import Tensor as Tensor
from apportion.frontend.builder import add as add
from apportion.frontend.builder import amax as amax
from apportion.frontend.builder import amin as amin
from apportion.frontend.builder import argmax as argmax
from apportion.frontend.builder import cast as cast
from apportion.frontend.builder import dim as dim
from apportion.frontend.builder import div as div
from apportion.frontend.builder import exp as exp
from apportion.frontend.builder import gelu as gelu
from apportion.frontend.builder import hint as hint
from apportion.frontend.builder import log as log
from apportion.frontend.builder import matmul as matmul
from apportion.frontend.builder import maximum as maximum
from apportion.frontend.builder import mean as mean
from apportion.frontend.builder import minimum as minimum
from apportion.frontend.builder import mul as mul
from apportion.frontend.builder import neg as neg
from apportion.frontend.builder import program as program
from apportion.frontend.builder import relu as relu
from apportion.frontend.builder import rsqrt as rsqrt
from apportion.frontend.builder import sigmoid as sigmoid
from apportion.frontend.builder import silu as silu
from apportion.frontend.builder import sqrt as sqrt
from apportion.frontend.builder import sub as sub
from apportion.frontend.builder import sum as sum
from apportion.frontend.builder import tanh as tanh
from apportion.frontend.json_format import dumps as dumps
from apportion.frontend.json_format import load as load
from apportion.frontend.json_format import loads as loads
from apportion.ir.program import Program as Program
from apportion.planned import PlannedProgram as PlannedProgram
from apportion.planned import plan as plan
from apportion.target.target import Target as Target
