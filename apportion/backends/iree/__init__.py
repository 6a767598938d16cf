"""The iree backend: the plan as parallel IR (``scf.forall`` on tensors), compiled and run by
IREE, whole-tensor host steps between modules."""
