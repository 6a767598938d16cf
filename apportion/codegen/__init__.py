"""Emitters: the LoopSpec program and the MLIR loop bundle of a plan.

The builder is ``apportion.codegen.loopspec.loopspec`` (not re-exported here, where the name
would hide its module).
"""

from apportion.codegen.bundle import bundle_mlir as bundle_mlir
from apportion.codegen.bundle import render_bundle as render_bundle
from apportion.codegen.mlir import verify_mlir as verify_mlir
from apportion.codegen.spec_text import from_json as from_json
from apportion.codegen.spec_text import from_source as from_source
from apportion.codegen.spec_text import to_json as to_json
from apportion.codegen.spec_text import to_source as to_source
from apportion.codegen.specs import LoopSpec as LoopSpec
from apportion.codegen.specs import OpSpec as OpSpec
from apportion.codegen.specs import TensorArg as TensorArg
