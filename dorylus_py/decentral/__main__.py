import sys

from dorylus_py.decentral.launcher import worker_process

sys.exit(worker_process())
