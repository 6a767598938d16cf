"""``ap.targets``: the built-in targets and the TOML loader."""

from apportion.target.presets import PRESETS as PRESETS
from apportion.target.presets import cpu as cpu
from apportion.target.presets import gpu as gpu
from apportion.target.presets import load_toml as load_toml
from apportion.target.presets import resolve as resolve
from apportion.target.presets import spyre as spyre
from apportion.target.target import Target as Target
