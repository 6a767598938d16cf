"""``ap.targets``: the built-in targets and the TOML loader.

Importing it registers this host's split-K measurer (``host_splitk.measure_host``) and the
digest of the code it times (``host_splitk.fingerprint``) with the ``cpu`` preset's table
(``target/host.py``): the stock ``cpu`` target measures its table on first use on a machine
(and code) whose table is not cached.
"""

from apportion.target.host import set_measurer as _set_measurer
from apportion.target.presets import PRESETS as PRESETS
from apportion.target.presets import cpu as cpu
from apportion.target.presets import gpu as gpu
from apportion.target.presets import load_toml as load_toml
from apportion.target.presets import resolve as resolve
from apportion.target.presets import spyre as spyre
from apportion.target.target import Target as Target
from apportion.targets.host_splitk import fingerprint as _fingerprint
from apportion.targets.host_splitk import measure_host as _measure_host

_set_measurer(_measure_host, _fingerprint)
