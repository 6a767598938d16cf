"""The one lowered form of a plan: ``Schedule`` values (``values.py``) and ``lower``."""

from apportion.schedule.lower import lower as lower
from apportion.schedule.values import Copy as Copy
from apportion.schedule.values import Finish as Finish
from apportion.schedule.values import Host as Host
from apportion.schedule.values import Init as Init
from apportion.schedule.values import Launch as Launch
from apportion.schedule.values import Lifetime as Lifetime
from apportion.schedule.values import Loop as Loop
from apportion.schedule.values import Operand as Operand
from apportion.schedule.values import Schedule as Schedule
from apportion.schedule.values import Step as Step
from apportion.schedule.values import WorkerAxis as WorkerAxis
