import numpy as np
import pytest

from dorylus_py.protocol import Message, ProtocolError, require


def test_require_checks_fields_and_shapes():
    msg = Message("result", {"task": 1}, {"Z": np.zeros((3, 4), np.float32)})
    require(msg, "task", shapes={"Z": (3, 4)})
    with pytest.raises(ProtocolError, match="missing 'loss_sum'"):
        require(msg, "loss_sum")
    with pytest.raises(ProtocolError, match=r"shape \[3, 4\], expected \[3, 5\]"):
        require(msg, shapes={"Z": (3, 5)})
