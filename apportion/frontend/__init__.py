"""Program sources: the JSON program format and the Python builder."""

from apportion.frontend.json_format import dumps as dumps
from apportion.frontend.json_format import load as load
from apportion.frontend.json_format import loads as loads
