"""A graph server with a fault put in on purpose: every weight gradient of an epoch is forwarded a second
time once the next epoch's backward forwards its first, so the copy reaches the weight server after
its own epoch's update, where a weight server without its duplicate check would add it to the next
epoch's sum. Started in place of ``python -m graph_servers`` by ``test_distributed.py``."""

from dorylus_py.serving.process import exit_process, serve_process
from graph_servers.server import GraphServer


class ResendingGraphServer(GraphServer):
    def __init__(self, node, start):
        super().__init__(node, start)
        self.held: list = []  # (instruction, request, message) of the gradients forwarded once so far

    def _on_ForwardGradient(self, inst, request, msg) -> None:
        for old in [h for h in self.held if h[0].key.epoch < inst.key.epoch]:
            super()._on_ForwardGradient(*old)
            self.held.remove(old)
        self.held.append((inst, request, msg))
        super()._on_ForwardGradient(inst, request, msg)


if __name__ == "__main__":
    exit_process(serve_process("graph-server", ResendingGraphServer))  # as graph_servers/__main__.py ends (its docstring: why)
