"""``ap.strategies``: the planning strategies as values, for ``ap.plan(..., strategy=...)`` and
``ap.backend(strategy=...)``.

>>> from apportion.strategies import Greedy, parse_strategy
>>> parse_strategy("greedy-multiples") == Greedy(rule="multiples")
True
"""

from apportion.passes.strategy import STRATEGIES as STRATEGIES
from apportion.passes.strategy import Balanced as Balanced
from apportion.passes.strategy import Greedy as Greedy
from apportion.passes.strategy import Strategy as Strategy
from apportion.passes.strategy import parse_strategy as parse_strategy
