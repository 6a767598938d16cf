"""What a program means: numpy kernels, the unplanned run, random inputs and the comparison every
backend is checked with (the reference executor itself is ``apportion.backends.reference``)."""

from apportion.runtime.kernels import round_bf16 as round_bf16
from apportion.runtime.kernels import storage_dtype as storage_dtype
from apportion.runtime.kernels import to_storage as to_storage
from apportion.runtime.reference import TOLERANCES as TOLERANCES
from apportion.runtime.reference import OutputCheck as OutputCheck
from apportion.runtime.reference import Tolerance as Tolerance
from apportion.runtime.reference import check_cover as check_cover
from apportion.runtime.reference import compare as compare
from apportion.runtime.reference import evaluate_op as evaluate_op
from apportion.runtime.reference import partial_result as partial_result
from apportion.runtime.reference import random_inputs as random_inputs
from apportion.runtime.reference import run_op_boxes as run_op_boxes
from apportion.runtime.reference import run_unplanned as run_unplanned
