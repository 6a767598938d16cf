"""The dtensor backend: a ``MeshSchedule`` (a program sharded over a mesh of devices, lowered)
run on ``torch.distributed``, one process per device, its values DTensors placed as the
schedule's layouts say.

``runner`` launches the ranks and checks the gathered outputs, ``launch`` watches them
(failures, the root cause, timeouts, the run's folder), ``rank`` is what one rank runs (every
stage of the schedule, placement checks after each step) and ``adapter`` the ``Backend``. It
consumes only the schedule: it imports neither ``apportion.sharding`` nor ``apportion.passes``.
"""
