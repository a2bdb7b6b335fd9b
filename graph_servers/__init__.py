"""The graph-server process (see ``server.py``)."""
