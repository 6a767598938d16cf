"""The ``apportion bench`` suites, one module each, run through one harness (``harness.py``)."""
