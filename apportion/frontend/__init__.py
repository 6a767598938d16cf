"""Program sources: the JSON program format, the Python builder and PyTorch models
(``torch_export.from_torch``, also ``ap.from_torch``; imported on use, as it needs torch)."""

from apportion.frontend.json_format import dumps as dumps
from apportion.frontend.json_format import load as load
from apportion.frontend.json_format import loads as loads
