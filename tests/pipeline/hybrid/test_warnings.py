"""The one missing-backend warning and its one rule (`proxy/pipeline/hybrid/warnings.py`): a
backend that is unreachable, timed out, 5xx or throttled is left out of a hybrid answer with a
warning naming it; any other failure is the answer. The query path (`fetch.py`, see
test_fetch.py) and the metadata fan-out (`proxy/api/metadata.py`, below with fake backends)
follow the same rule and give the same text."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from proxy.api.metadata import fan_out
from proxy.backends import BackendReply
from proxy.errors import PromError
from proxy.pipeline.hybrid.warnings import ALL_LOST, OVERLAP_LOST, lost_between, missing_warning, unavailable
from proxy.pipeline.values import PieceFailed
from shardplanner.holdings import BackendHolding


def reply(status: int, body: Any = None) -> BackendReply:
    return BackendReply(status, orjson.dumps(body if body is not None else {"status": "error"}), "application/json")


def test_the_rule_for_exceptions_and_replies_alike() -> None:
    for status, why in ((500, "HTTP 500"), (503, "HTTP 503"), (429, "HTTP 429"), (400, None), (404, None),
                        (422, None), (302, None)):
        assert unavailable(reply(status)) == why, status
        assert unavailable(PieceFailed(reply(status))) == why, status  # the same reply, raised
    assert unavailable(PromError("unavailable", "backend 'amp' is unreachable")) == "unavailable"
    assert unavailable(PromError("timeout", "backend 'amp' did not answer in time")) == "timeout"
    for kind in ("bad_data", "execution", "not_found"):
        assert unavailable(PromError(kind, "a bad query")) is None, kind
    assert unavailable(ValueError("not a backend's failure")) is None


def test_the_one_text() -> None:
    assert missing_warning(("amp",), "HTTP 503", ALL_LOST) == \
        "promaccel: backend 'amp' did not answer (HTTP 503); its data is missing"
    assert missing_warning(("amp", "local"), "timeout", lost_between(1_700_000_000_000, 1_700_000_060_500)) == (
        "promaccel: backend 'amp'+'local' did not answer (timeout); the data from 1700000000 to "
        "1700000060.500 is missing")
    assert missing_warning(("local",), "unavailable", OVERLAP_LOST).endswith(
        "this answer holds only the data of the other backends for the times both hold")


@dataclass
class Cfg:
    name: str

    def holdings(self, now_ms: int) -> list[BackendHolding]:
        return [BackendHolding(self.name, (".*",))]


@dataclass
class FakeBackend:
    """A metadata backend answering `outcome` (a reply, or an exception raised)."""

    name: str
    outcome: BackendReply | BaseException
    cfg: Cfg = field(init=False)

    def __post_init__(self) -> None:
        self.cfg = Cfg(self.name)

    async def request_sound(self, method: str, path: str, **kw: Any) -> BackendReply:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def labels(*backends: FakeBackend) -> Any:
    return asyncio.run(fan_out(backends, "GET", "/api/v1/labels", [], "labels", None, None, None,  # type: ignore[arg-type]
                               0, "/api/v1/labels"))


OK = reply(200, {"status": "success", "data": ["job"]})


@pytest.mark.parametrize(("outcome", "why"), [
    (reply(503), "HTTP 503"), (reply(429), "HTTP 429"),
    (PromError("unavailable", "backend 'amp' is unreachable (ConnectError)"), "unavailable"),
    (PromError("timeout", "backend 'amp' did not answer in time"), "timeout"),
    (BackendReply(200, b"{not json", "application/json"), "unavailable"),
])
def test_metadata_leaves_out_a_missing_backend_with_the_one_warning(outcome: Any, why: str) -> None:
    response = labels(FakeBackend("local", OK), FakeBackend("amp", outcome))
    body = orjson.loads(response.body)
    assert response.status_code == 200 and body["data"] == ["job"]
    assert body["warnings"] == [missing_warning(("amp",), why, ALL_LOST)]


def test_metadata_relays_any_other_failure() -> None:
    bad = reply(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
    response = labels(FakeBackend("local", OK), FakeBackend("amp", bad))
    assert response.status_code == 400 and orjson.loads(response.body)["error"] == "parse error"
    with pytest.raises(PromError) as err:  # not a missing backend: the same for every backend
        labels(FakeBackend("local", OK), FakeBackend("amp", PromError("bad_data", "bad match[]")))
    assert err.value.kind == "bad_data"
    with pytest.raises(PromError) as err:  # every backend missing: the first failure
        labels(FakeBackend("local", PromError("timeout", "slow")), FakeBackend("amp", reply(503)))
    assert err.value.kind == "timeout"
