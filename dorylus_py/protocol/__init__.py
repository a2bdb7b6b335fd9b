"""The wire format shared by graph servers, weight servers, tensor workers and the driver: signed
multipart messages (:class:`Session`), checked before anything in them is parsed."""

from dorylus_py.protocol.messages import AuthError, Message, ProtocolError, integer, require
from dorylus_py.protocol.session import Limits, Session

__all__ = ["AuthError", "Limits", "Message", "ProtocolError", "Session", "integer", "require"]
