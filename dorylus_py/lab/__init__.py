"""A lab: a multi-machine job on one box, for tests and for trying a cluster before renting one.

``network.py`` makes hosts as network namespaces on a private bridge and shapes their links
(``shaping.py``); ``supervisor.py`` restarts a host's service when it fails, as systemd does;
``lambda_service.py`` serves the Lambda Invoke API from a host of its own (``sigv4.py`` checks who
calls); ``cluster.py`` puts a job's roles on the hosts; ``capture.py`` reads what crosses the bridge.
``python -m dorylus_py.lab`` runs a job on a lab from the command line (docs/lab.md).
"""
