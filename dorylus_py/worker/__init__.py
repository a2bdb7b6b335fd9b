"""The tensor worker: one tensor task per invocation (``handler.py``), the same code in AWS Lambda (the
image's entry point is ``lambda_functions/handler.py``), in the local Lambda emulator's processes and in
a graph server's own threads; the event it is invoked with (``event.py``), its requests in flight
(``channel.py``), the emulated link (``link.py``), a warm container's rows (``row_cache.py``) and
streaming within a task (``stream.py``)."""
