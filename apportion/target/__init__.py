"""``ap.targets``: the hardware model (cores, span limit, sticks, scratchpad, cost figures), the
built-in targets (``spyre``, ``cpu``, ``gpu``) and the TOML loader.

``import apportion`` registers this host's split-K measurer (``workflows/host_splitk.py``)
with the ``cpu`` preset's table (``host.py``), which this package cannot import: it plans and
compiles with IREE.
"""

from apportion.target.layout import DeviceDim as DeviceDim
from apportion.target.layout import DeviceLayout as DeviceLayout
from apportion.target.layout import device_layout as device_layout
from apportion.target.presets import PRESETS as PRESETS
from apportion.target.presets import cpu as cpu
from apportion.target.presets import gpu as gpu
from apportion.target.presets import load_toml as load_toml
from apportion.target.presets import resolve as resolve
from apportion.target.presets import spyre as spyre
from apportion.target.target import Target as Target
