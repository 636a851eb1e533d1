"""The chaos bench's answer classes (loadtests/chaos.py) and the fault proxy's random mode
(loadtests/faults.py): pure logic, in process."""

from __future__ import annotations

import orjson

from loadtests.chaos import classify
from loadtests.faults import FAULTS, FaultyBackend

ANSWER = orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"Hostname": "n1"}, "value": [1793491200, "42"]}]}})
DIRECT = (200, ANSWER)
JSON = "application/json"


def test_classify() -> None:
    assert classify(DIRECT, 200, JSON, ANSWER) == ("exact", "")
    err = orjson.dumps({"status": "error", "errorType": "unavailable", "error": "backend 'default' is unreachable"})
    kind, detail = classify(DIRECT, 503, JSON, err)
    assert kind == "json_error" and "unreachable" in detail
    assert classify(DIRECT, 200, JSON, ANSWER[: len(ANSWER) // 2])[0] == "bad"  # a broken 200
    assert classify(DIRECT, 502, "text/html", b"<html><h1>502 Bad Gateway</h1></html>")[0] == "bad"
    wrong = ANSWER.replace(b'"42"', b'"41"')
    kind, detail = classify(DIRECT, 200, JSON, wrong)
    assert kind == "bad" and "42" in detail
    assert classify(DIRECT, 400, JSON, err)[0] == "bad"  # a 4xx where Prometheus answered: not a fault's error
    assert classify(DIRECT, 200, "text/plain", ANSWER)[0] == "bad"
    # Prometheus's own error, relayed as it is: exact.
    bad_query = orjson.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"})
    assert classify((400, bad_query), 400, JSON, bad_query) == ("exact", "")


def test_random_faults_are_seeded_and_near_the_rate() -> None:
    def draw(seed: int) -> list[str | None]:
        b = FaultyBackend("http://127.0.0.1:9", port=1)
        b.set_random(0.2, FAULTS, seed)
        return [b._choose(b"k") for _ in range(5000)]

    first = draw(1)
    assert first == draw(1) and first != draw(2)
    faults = [f for f in first if f is not None]
    assert 0.18 < len(faults) / len(first) < 0.22
    assert set(faults) == set(FAULTS)
