"""What the command line does, as Python functions: a PyTorch model loaded from a factory or a
``.pt2`` file, planned and checked against the model run eagerly (``torch_model``); a program
sharded over a device mesh, lowered and run or checked on a backend of the registry
(``sharded``); a plan compiled by IREE and run with its compile and run times (``iree``);
this host's split-K table measured for the ``cpu`` preset (``host_splitk``, registered with
``target/host.py`` by ``import apportion``).
"""
