"""The torch backend: the plan run with PyTorch kernels, core slices on a thread pool."""
