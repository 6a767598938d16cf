"""A toy backend outside apportion, as another distribution would ship one (see
``tests/backends/test_toy_backend.py``)."""
