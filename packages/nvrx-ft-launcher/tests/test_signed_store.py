"""The one signed-store envelope: seal, unseal, read, compare-and-set, reject once.

Real stores: torch's HashStore (the operations every rendezvous store has) and one with
only etcd's (no compare-and-set).
"""

from __future__ import annotations

import json
import logging

import pytest
from test_coordination import EtcdLikeStore  # type: ignore[import-not-found]
from torch._C._distributed_c10d import HashStore

from nvrx.launcher._job_key import sign
from nvrx.launcher._signed_store import (
    Rejections,
    SignedStore,
    context,
    journal_rejections,
    seal,
    unseal,
)

KEY = b"k" * 32
RUN = "job#" + "1" * 32


def test_the_envelope_is_version_body_and_mac_over_the_context() -> None:
    sealed = json.loads(seal(KEY, RUN, "cycle/0/decision", '{"a": 1}'))
    assert set(sealed) == {"v", "body", "mac"}
    assert sealed["v"] == 1
    assert sealed["body"] == '{"a": 1}'
    assert context(RUN, "cycle/0/decision") == f"nvrx.launcher/v1/{RUN}/cycle/0/decision"
    assert sealed["mac"] == sign(KEY, context(RUN, "cycle/0/decision"), b'{"a": 1}')
    assert json.loads(seal(None, RUN, "x", "{}"))["mac"] is None


def test_unseal_gives_back_the_body_it_sealed() -> None:
    assert unseal(KEY, RUN, "n", seal(KEY, RUN, "n", "body")) == "body"
    assert unseal(None, RUN, "n", seal(None, RUN, "n", "body").encode()) == "body"
    # Without a key a signed value is still read (its MAC is not checked).
    assert unseal(None, RUN, "n", seal(KEY, RUN, "n", "body")) == "body"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("not json", "not a JSON envelope"),
        ('{"body": "{}", "mac": null}', "fields v, body, mac"),
        ('{"v": 2, "body": "{}", "mac": null}', "wire version 2"),
        ('{"v": 1, "body": 3, "mac": null}', "body must be a string"),
        ('{"v": 1, "body": "{}", "mac": null}', "not signed with this job's key"),
        (seal(b"x" * 32, RUN, "n", "{}"), "not signed with this job's key"),
        (seal(KEY, "job#" + "2" * 32, "n", "{}"), "not signed with this job's key"),  # a run
        (seal(KEY, RUN, "other", "{}"), "not signed with this job's key"),  # another key
    ],
)
def test_with_a_key_every_other_value_is_refused_saying_why(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        unseal(KEY, RUN, "n", value)


def test_a_bound_on_the_size_is_kept() -> None:
    big = seal(KEY, RUN, "n", "x" * 200)
    with pytest.raises(ValueError, match="more than 100"):
        unseal(KEY, RUN, "n", big, max_bytes=100)


def test_read_parses_a_valid_value_and_treats_others_as_absent() -> None:
    store = HashStore()
    reported: list[tuple[str, str]] = []
    rejections = Rejections(lambda where, why: reported.append((where, why)))
    signed = SignedStore(store, KEY, RUN, prefix="p", rejections=rejections)
    assert signed.read("a", json.loads) is None  # absent: nothing reported
    signed.set("a", '{"x": 1}')
    assert signed.read("a", json.loads) == {"x": 1}
    store.set("b", '{"v": 1, "body": "{}", "mac": null}')
    assert signed.read("b", json.loads) is None
    signed.set("c", "not json")
    assert signed.read("c", json.loads) is None  # the parser's refusal is a rejection too
    assert [where for where, _ in reported] == ["p/b", "p/c"]


def test_a_rejected_value_is_logged_and_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    store = HashStore()
    reported: list[tuple[str, str]] = []
    signed = SignedStore(
        store, KEY, RUN, prefix="p", rejections=Rejections(lambda w, y: reported.append((w, y)))
    )
    store.set("a", "garbage")
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        for _ in range(3):
            assert signed.read("a", str) is None
    assert caplog.text.count("ignoring the value under p/a in the rendezvous store") == 1
    assert len(reported) == 1
    store.set("a", "other garbage")  # another value: said again
    assert signed.read("a", str) is None
    assert len(reported) == 2


def test_rejections_without_a_hook_go_to_the_journal_hook() -> None:
    # The run nonce, group ranks and segment gate read without a hook of their own;
    # the agent points journal_rejections at its journal.
    journalled: list[tuple[str, str]] = []
    own: list[tuple[str, str]] = []
    store = HashStore()
    previous = journal_rejections(lambda w, y: journalled.append((w, y)))
    try:
        plain = SignedStore(store, KEY, RUN, prefix="n")
        hooked = SignedStore(
            store, KEY, RUN, prefix="c", rejections=Rejections(lambda w, y: own.append((w, y)))
        )
        store.set("a", "garbage")
        assert plain.read("a", str) is None
        assert hooked.read("a", str) is None
    finally:
        assert journal_rejections(previous) is not None
    assert [w for w, _ in journalled] == ["n/a"]
    assert [w for w, _ in own] == ["c/a"]  # a hook of its own wins
    store.set("a", "more garbage")
    assert plain.read("a", str) is None  # no journal hook: logged only
    assert len(journalled) == 1


def test_compare_set_keeps_the_first_value() -> None:
    store = HashStore()
    first = SignedStore(store, KEY, RUN)
    second = SignedStore(store, KEY, RUN)
    assert first.compare_set("k", "one") is True
    assert second.compare_set("k", "two") is False
    assert second.read("k", str) == "one"


def test_compare_set_replaces_exactly_an_invalid_value() -> None:
    store = HashStore()
    signed = SignedStore(store, KEY, RUN)
    store.set("k", '{"v": 1, "body": "forged", "mac": null}')

    def stands(data: bytes) -> bool:
        return signed.parse("k", data, str) is not None

    # Without a validity check whatever is there stands; with it, a forgery is replaced.
    assert signed.compare_set("k", "mine") is False
    assert signed.compare_set("k", "mine", stands=stands) is True
    assert signed.read("k", str) == "mine"
    assert signed.compare_set("k", "later", stands=stands) is False


def test_without_compare_and_set_the_caller_is_told() -> None:
    signed = SignedStore(EtcdLikeStore(), KEY, RUN)
    assert signed.compare_set("k", "v") is None
