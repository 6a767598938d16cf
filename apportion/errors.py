"""Exception types. Every error apportion raises on bad input is an ``ApportionError``."""

from __future__ import annotations


class ApportionError(Exception):
    """Base of every error apportion raises for bad input or an impossible plan."""


class ProgramError(ApportionError):
    """The program is malformed: names the op, tensor and dim at fault."""


class TargetError(ApportionError):
    """The target description is invalid (core count, sizes, TOML fields)."""


class PlanningError(ApportionError):
    """No plan satisfies the target's limits; names the op, tensor, dim and limit."""


class ExecutionError(ApportionError):
    """A plan could not be executed, or its result differs from the unplanned program."""


class EmitError(ApportionError):
    """A plan cannot be emitted in the asked form, or the emitted IR does not verify."""


class UsageError(ApportionError):
    """A bad option value given to a command: an option, a ``--param``, an output path."""


class CalibrationError(ApportionError):
    """Measurements cannot be read or fitted: names the record, the field and the fault."""
