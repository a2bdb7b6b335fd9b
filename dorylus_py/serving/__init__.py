"""What every server process shares, whichever its role: the job it is given (``job.py``), its sockets and
loop (``node.py``: ``ServerNode``, ``serve_process``), its heartbeat to the driver (``heartbeat.py``) and how
it tells a refusal from a bug (``rejections.py``). The driver's side of a job is ``dorylus_py/cluster``."""
