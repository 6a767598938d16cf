"""What the command line does, as Python functions: a PyTorch model loaded from a factory or a
``.pt2`` file, planned and checked against the model run eagerly (``torch_model``).
"""
