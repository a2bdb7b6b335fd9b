from dorylus_py.serving.process import exit_process, serve_process
from graph_servers.server import GraphServer

exit_process(serve_process("graph-server", GraphServer))
