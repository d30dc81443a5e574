"""A rollback request reaches the model's owner on the joined topic; read again after a
crash, it is done once (its id is in the republished document)."""

from __future__ import annotations

import pytest

from calmon.cluster.admin import apply_rollback, decode_request, encode_request
from calmon.cluster.batch import BatchError, decode
from calmon.errors import CalibratorError
from calmon.recal.registry import Registry


def test_a_request_is_done_once_and_never_taken_for_a_batch() -> None:
    data = encode_request("ctr", "__all__", 1, "r-1")
    with pytest.raises(BatchError):
        decode(data)
    req = decode_request(data)
    assert req == {"model": "ctr", "segment": "__all__", "to": 1, "request_id": "r-1"}
    assert decode_request(b"CMR1{not json") is None and decode_request(b"CMJ1...") is None
    reg = Registry(None)
    for t in (2.0, 3.0):
        reg.publish({"model": "ctr", "segment": "__all__", "method": "temperature",
                     "input": "logit", "params": {"temperature": t}})
    doc = apply_rollback(reg, req)
    assert doc is not None and doc["version"] == 3 and doc["rollback_of"] == 1
    assert doc["params"]["temperature"] == 2.0
    assert apply_rollback(reg, req) is None  # the same request again: nothing
    assert reg.versions("ctr", "__all__") == [1, 2, 3]
    with pytest.raises(CalibratorError):
        apply_rollback(reg, {**req, "to": 7, "request_id": "r-2"})
