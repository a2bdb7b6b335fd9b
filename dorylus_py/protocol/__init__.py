"""The wire format shared by graph servers, weight servers, tensor workers and the driver."""

from dorylus_py.protocol.messages import Message, ProtocolError, decode, encode, require

__all__ = ["Message", "ProtocolError", "decode", "encode", "require"]
