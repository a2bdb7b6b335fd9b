"""AWS Lambda's entry point (the image's ``CMD``): the tensor worker itself is the library's,
``dorylus_py/worker/handler.py``, the same code the local emulator and the graph servers' threads run."""

from dorylus_py.worker.handler import handler

__all__ = ["handler"]
