"""Whole answers kept for a window asked again (proxy/pipeline/answer_memo.py): in process, the
rule (the same cell objects for the same pieces, else nothing); against real Prometheus and
Redis, that a window asked again is answered with the kept bytes and that those are
Prometheus's answer, and that a cell invalidated by another promaccel on the same Redis is
never answered for from the kept bytes."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
import redis
import yaml

from loadtests.compare import diff_answers
from proxy.backends.tenancy import Caller, Tenant
from proxy.cache.store import PieceStore, Tagged
from proxy.pipeline.answer_memo import ENTRY_SHARE, AnswerMemo, Recall
from proxy.pipeline.context import RequestContext
from proxy.pipeline.explain import Explanation
from proxy.pipeline.landing import LANDING_GRACE_S
from proxy.pipeline.values import CacheCtx, Encoded, Query
from proxy.result import QueryResult
from tests.pipeline.stage_helpers import T0, H, Recorder, range_query, run
from tests.servers import Promaccel, metric_sum

CTX = CacheCtx(tenant="", route=("default",), now_ms=T0 + 30 * H, lookback_ms=300_000)


def _query(query: str = "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", hours: int = 2, **kw: Any) -> Query:
    plan = SimpleNamespace(sharded=False, pieces=[1, 2])
    return replace(range_query(query, hours=hours), **{"gzip": True, "cache": CTX, "plan": plan, **kw})


def _cell() -> QueryResult:
    return QueryResult.from_series("matrix", [({"__name__": "x"}, [T0], [1.0])])


def _slots(cells: list[QueryResult | None], digests: tuple[str, ...] = ("a", "b")) -> list[Any]:
    return [SimpleNamespace(result=c, answered_by=d if c is not None else None, order=(-1, "", T0 + i * H),
                            piece=SimpleNamespace(span=("span", i)), keys=(SimpleNamespace(digest=d),))
            for i, (c, d) in enumerate(zip(cells, digests))]


def test_the_same_cells_get_the_kept_bytes_and_other_cells_do_not() -> None:
    memo = AnswerMemo(1 << 20)
    a, b = _cell(), _cell()
    first = memo.ticket(_query(), _slots([a, b]))
    assert first is not None and memo.get(first) is None
    first.keep(b"gz-bytes", True)
    again = memo.ticket(_query(), _slots([a, b]))
    assert again is not None and memo.get(again) == Encoded(b"gz-bytes", True)
    # One piece answered by another object (read again: changed in the store, or a fresh cut).
    assert memo.get(memo.ticket(_query(), _slots([a, _cell()]))) is None  # type: ignore[arg-type]
    # The same objects under other keys, or in another order of pieces: not the same answer.
    assert memo.get(memo.ticket(_query(), _slots([a, b], ("a", "c")))) is None  # type: ignore[arg-type]
    assert memo.get(memo.ticket(_query(), _slots([b, a]))) is None  # type: ignore[arg-type]
    # Another request (window, tenant) never gets it.
    assert memo.get(memo.ticket(_query(hours=3), _slots([a, b]))) is None  # type: ignore[arg-type]
    tenant = RequestContext(caller=Caller(Tenant((), "t2")))
    assert memo.get(memo.ticket(_query(ctx=tenant), _slots([a, b]))) is None  # type: ignore[arg-type]
    # Still there for the right cells.
    assert memo.get(memo.ticket(_query(), _slots([a, b]))) is not None  # type: ignore[arg-type]


def test_a_cell_gone_from_memory_takes_the_answer_with_it() -> None:
    memo = AnswerMemo(1 << 20)
    a, b = _cell(), _cell()
    t = memo.ticket(_query(), _slots([a, b]))
    assert t is not None
    t.keep(b"x" * 100, True)
    del t, b
    assert memo.get(memo.ticket(_query(), _slots([a, _cell()]))) is None  # type: ignore[arg-type]


def test_no_ticket_unless_every_piece_was_found_and_the_answer_may_be_kept() -> None:
    memo = AnswerMemo(1 << 20)
    a = _cell()
    assert memo.ticket(_query(), _slots([a, None])) is None  # a piece to fetch
    assert memo.ticket(_query(gzip=False), _slots([a, a])) is None  # no gzip asked (a subquery too)
    assert memo.ticket(_query(want_arrow=True), _slots([a, a])) is None
    assert memo.ticket(_query(cache=None), _slots([a, a])) is None  # the cache does not apply
    explained = RequestContext(explain=Explanation(True))
    assert memo.ticket(_query(ctx=explained), _slots([a, a])) is None
    assert AnswerMemo(0).ticket(_query(), _slots([a, a])) is None  # cache.answer_memo_bytes: 0
    not_read = _slots([a, a])
    not_read[1].answered_by = None  # answered otherwise than from a cache key (a finer step's cells)
    assert memo.ticket(_query(), not_read) is None


def test_the_bound_drops_the_least_recently_used_and_never_keeps_a_huge_answer() -> None:
    memo = AnswerMemo(8000)
    cells = [_cell() for _ in range(8)]
    tickets = []
    for i in range(4):
        t = memo.ticket(_query("up", hours=1 + i), _slots(cells[2 * i:2 * i + 2]))
        assert t is not None
        tickets.append(t)
        t.keep(bytes(600), True)
    assert memo.get(tickets[0]) is not None  # used: the second is now the oldest
    big = tickets[3]
    memo.put(big, Encoded(bytes(8000 // ENTRY_SHARE + 1), True))  # over its share: not kept, the old one stays
    assert memo.get(big) is not None and memo.get(big).body == bytes(600)  # type: ignore[union-attr]
    for i in range(4, 12):  # newer answers push the least recently used out
        t = memo.ticket(_query("up", hours=1 + i), _slots([cells[0], cells[1]]))
        assert t is not None
        t.keep(bytes(600), True)
    assert memo.used <= 8000
    assert memo.get(tickets[1]) is None
    memo.clear()
    assert memo.used == 0 and memo.get(tickets[0]) is None


class FakeStore:
    """get_tagged answering each key with `reply(known tag)`; records what it was asked."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.asked: list[tuple[Any, Any]] = []

    async def get_tagged(self, keys: Any, known: Any) -> list[Tagged]:
        self.asked.append((list(keys), list(known)))
        return [self.reply(t) for t in known]

    # PieceStore.unchanged, as the stores without tracking answer it.
    unchanged = PieceStore.unchanged


def _kept_with_tags(memo: AnswerMemo) -> tuple[list[QueryResult], Query]:
    """An answer kept whole whose two cells were kept decoded with their tags."""
    cells = [_cell(), _cell()]
    held = {"a": (b"tag-a", cells[0]), "b": (b"tag-b", cells[1])}
    slots = _slots(cells)
    q = _query()
    t = memo.ticket(q, slots, held.get)
    assert t is not None and t.deps is not None and t.deps.tags == (b"tag-a", b"tag-b")
    t.keep(b"gz", True)
    return cells, q


def test_recall_answers_before_planning_while_every_cells_tag_is_unchanged() -> None:
    memo = AnswerMemo(1 << 20)
    cells, q = _kept_with_tags(memo)
    same = FakeStore(lambda tag: Tagged(None, tag))
    nxt = Recorder()
    answer = run(Recall(memo, lambda: same, "default", nxt)(replace(q, plan=None, cache=None)))
    assert answer.encoded == Encoded(b"gz", True) and answer.headers["X-Cache"] == "HIT" and nxt.got == []
    assert same.asked == [([k for k in same.asked[0][0]], [b"tag-a", b"tag-b"])]
    # A cell written again (another tag), gone (a miss), or the store failing: down the path.
    for store in (FakeStore(lambda tag: Tagged(b"payload", b"other")), FakeStore(lambda tag: Tagged(None, None))):
        nxt = Recorder()
        answer = run(Recall(memo, lambda: store, "default", nxt)(replace(q, plan=None, cache=None)))  # noqa: B023
        assert answer.encoded is None and len(nxt.got) == 1
    # Not for another backend, a client without gzip, or explain.
    for other, ident in ((q, "elsewhere"), (replace(q, gzip=False), "default"),
                         (replace(q, ctx=RequestContext(explain=Explanation(True))), "default")):
        nxt = Recorder()
        run(Recall(memo, lambda: same, ident, nxt)(other))
        assert len(nxt.got) == 1


def test_recall_needs_every_cell_kept_with_its_tag_and_an_unsharded_plan() -> None:
    memo = AnswerMemo(1 << 20)
    cells = [_cell(), _cell()]
    slots = _slots(cells)
    q = _query()
    only_a = {"a": (b"tag-a", cells[0])}
    assert memo.ticket(q, slots, only_a.get).deps is None  # type: ignore[union-attr]
    other_object = {"a": (b"tag-a", cells[0]), "b": (b"tag-b", _cell())}
    assert memo.ticket(q, slots, other_object.get).deps is None  # type: ignore[union-attr]
    both = {"a": (b"tag-a", cells[0]), "b": (b"tag-b", cells[1])}
    sharded = _query(plan=SimpleNamespace(sharded=True, pieces=[1, 2]))
    assert memo.ticket(sharded, slots, both.get).deps is None  # type: ignore[union-attr]
    # Kept from landing-zone cells (no tags yet), then found again with tags: recallable from then on.
    t = memo.ticket(q, slots, only_a.get)
    assert t is not None
    t.keep(b"gz", True)
    key = t.key
    assert memo.recallable(key) is None and memo.recallable(key, only_a.get) is None
    # Recall finds its cells kept with tags by the reader (read back once stored) ...
    assert memo.recallable(key, both.get) is not None
    # ... as does a lookup that finds the same cells.
    t = memo.ticket(_query("up"), slots, only_a.get)
    assert t is not None
    t.keep(b"gz", True)
    assert memo.recallable(t.key) is None
    assert memo.get(memo.ticket(_query("up"), slots, both.get)) is not None  # type: ignore[arg-type]
    assert memo.recallable(t.key) is not None


# --- against real Prometheus and Redis ----------------------------------------------------

QUERY = "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
ADMIN = "memo-admin-token"


def _start(prom: Any, redis_url: str, workdir: Path, name: str) -> Promaccel:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"backends": [{"url": prom.url}],
                                    "cache": {"redis_url": redis_url, "admin_token": ADMIN,
                                              "generation_refresh": "200ms"}}))
    return Promaccel.start(None, ("--split-interval", "1h"), workdir, config=path)


def _hits(url: str) -> float:
    return metric_sum(url, "promaccel_answer_memo_total", result="hit")


def _recalled(url: str) -> float:
    return metric_sum(url, "promaccel_answer_memo_total", result="recalled")


def _served(url: str) -> float:
    """Asks answered with kept bytes: after their lookup (hit) or before planning (recalled)."""
    return _hits(url) + _recalled(url)


def _calls(url: str) -> float:
    return metric_sum(url, "promaccel_backend_requests_total", endpoint="/api/v1/query_range")


def _ask(client: httpx.Client, url: str, form: dict[str, str]) -> tuple[httpx.Response, Any]:
    r = client.post(url + "/api/v1/query_range", data=form)
    assert r.status_code == 200, r.text[:300]
    return r, orjson.loads(r.content)


@pytest.mark.prom
def test_a_window_asked_again_is_answered_with_the_kept_bytes_until_a_cell_changes(
        prom: Any, redis_server: Any, tmp_path: Path) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/5"
    redis.Redis.from_url(url).flushdb()
    a = _start(prom, url, tmp_path, "a")
    b = _start(prom, url, tmp_path, "b")  # another replica on the same Redis
    try:
        end = prom.end_s
        form = {"query": QUERY, "start": str(end - 3 * 3600 + 17), "end": str(end - 1800), "step": "30"}
        with httpx.Client(timeout=120, headers={"Accept-Encoding": "gzip"}) as client:
            direct = orjson.loads(client.post(prom.url + "/api/v1/query_range", data=form).content)
            bodies = []
            # Cold (the answer kept under the landing zone's cells), then the kept bytes.
            for _ in range(3):
                r, doc = _ask(client, a.url, form)
                assert diff_answers(direct, doc) == []
                bodies.append(r.content)
            assert _served(a.url) == 2 and bodies[0] == bodies[1] == bodies[2]
            # Once stored, the cells are checked against Redis (the landed objects kept decoded
            # with their tags, or read again: then the answer is made again and kept); the
            # answer is then recalled before planning, its cells' tags read from Redis.
            time.sleep(LANDING_GRACE_S + 0.5)
            for _ in range(3):
                r, doc = _ask(client, a.url, form)
                assert diff_answers(direct, doc) == []
                bodies.append(r.content)
            assert r.headers["X-Cache"] == "HIT" and r.headers.get("Content-Encoding") == "gzip"
            assert _served(a.url) >= 3, "a window asked again was not answered with the kept bytes"
            assert _recalled(a.url) >= 1
            assert bodies[-1] == bodies[-2]  # the same bytes sent again
            assert metric_sum(a.url, "promaccel_warm_memo_bytes", memo="answer") > 0
            # Without gzip the client gets the JSON (not the kept gzip bytes).
            plain = httpx.post(a.url + "/api/v1/query_range", data=form, headers={"Accept-Encoding": "identity"},
                               timeout=60)
            assert plain.headers.get("Content-Encoding") is None
            assert diff_answers(direct, orjson.loads(plain.content)) == []
            # The other replica drops the cells from Redis, or moves the cache to a new
            # generation: this one must read them again, not answer from the bytes it kept.
            # (Pieces this process fetched itself are served from its landing zone for
            # LANDING_GRACE_S whatever the store says, kept bytes or not: waited out.)
            admin = {"Authorization": f"Bearer {ADMIN}"}
            for what in ("invalidate", "generation"):
                if what == "invalidate":
                    done = client.post(b.url + "/api/v1/admin/cache/invalidate",
                                       data={"match[]": "DCGM_FI_DEV_GPU_UTIL"}, headers=admin)
                    assert done.status_code == 200 and done.json()["data"]["dropped"] > 0
                else:
                    assert client.post(b.url + "/api/v1/admin/cache/generation", headers=admin).status_code == 200
                time.sleep(LANDING_GRACE_S + 0.5)  # and the generation read again (every 200 ms)
                calls, served = _calls(a.url), _served(a.url)
                r, doc = _ask(client, a.url, form)
                assert diff_answers(direct, doc) == [], what
                assert _served(a.url) == served and _calls(a.url) > calls, what
                # Stored again, read back with their tags: recalled again.
                recalled = _recalled(a.url)
                for _ in range(4):
                    time.sleep(LANDING_GRACE_S + 0.5)
                    for _ in range(2):
                        r, doc = _ask(client, a.url, form)
                        assert diff_answers(direct, doc) == [], what
                    if _recalled(a.url) > recalled:
                        break
                assert _recalled(a.url) > recalled, what
    finally:
        a.stop()
        b.stop()
