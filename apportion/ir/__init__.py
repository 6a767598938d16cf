"""The IR: dims, dtypes, tensors, ops as iteration spaces with indexing maps, programs."""

from apportion.ir.affine import AffineExpr as AffineExpr
from apportion.ir.affine import IndexingMap as IndexingMap
from apportion.ir.dtypes import DTYPE_BYTES as DTYPE_BYTES
from apportion.ir.dtypes import dtype_bytes as dtype_bytes
from apportion.ir.kinds import KINDS as KINDS
from apportion.ir.kinds import Category as Category
from apportion.ir.kinds import OpKind as OpKind
from apportion.ir.kinds import Reducer as Reducer
from apportion.ir.op import Access as Access
from apportion.ir.op import Op as Op
from apportion.ir.program import LoopLevel as LoopLevel
from apportion.ir.program import Program as Program
from apportion.ir.program import TensorType as TensorType
from apportion.ir.program import TilingGroup as TilingGroup
