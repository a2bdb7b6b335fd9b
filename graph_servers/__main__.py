from dorylus_py.serving.process import serve_process
from graph_servers.server import GraphServer

raise SystemExit(serve_process("graph-server", GraphServer))
