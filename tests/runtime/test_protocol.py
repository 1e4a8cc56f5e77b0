"""The typed pipe: one builder of the ``run`` request, one converter of journal entries."""

from __future__ import annotations

import io
import os

import pytest

from app.runtime.protocol import (
    PREFIX,
    PROTOCOL_VERSION,
    FrameError,
    as_run_request,
    decode_header,
    encode_frame,
    journal_bytes,
    read_frame_bytes,
    run_request,
)
from app.runtime.schemas import CallReply, HelperCall, JournalEntry, Limits


def _through_the_pipe(header: dict[str, object]) -> dict[str, object]:
    return decode_header(encode_frame(header)[PREFIX.size :])


def test_a_run_request_survives_the_pipe_with_every_limit() -> None:
    limits = Limits(cpu_seconds=3, disk_files=7)
    request = run_request(
        code="x = 1",
        workdir="/w/c1",
        limits=limits.to_wire(),
        helpers=["llm_call"],
        tools={"refund": ("order_id",)},
        journal=[JournalEntry(name="refund", digest="d", value={"ok": True}).to_wire()],
        keep=True,
    )
    read = as_run_request(_through_the_pipe(dict(request)))
    assert read == request
    assert Limits(**read["limits"]) == limits  # all ten fields travel, none is dropped
    assert "live" not in read
    assert "pid" not in read
    live = run_request(code="y", workdir="/w/c1", limits=limits.to_wire(), live_pid=42)
    assert (live["live"], live["pid"]) == (True, 42)
    # The journal is measured once, where the request is built: the worker and the child read it.
    assert read["journal_bytes"] == journal_bytes(request["journal"]) > 0
    assert live["journal_bytes"] == 0


@pytest.mark.parametrize("measure", [None, "12", -1, 1.5, True])
def test_a_run_request_without_its_journals_measure_is_refused(measure: object) -> None:
    header: dict[str, object] = dict(run_request(code="x", workdir="/w/c1", limits=Limits().to_wire()))
    if measure is None:
        del header["journal_bytes"]
    else:
        header["journal_bytes"] = measure
    with pytest.raises(FrameError, match="journal's measure"):
        as_run_request(header)


@pytest.mark.parametrize(
    "header",
    [
        {"t": "reply", "v": PROTOCOL_VERSION},
        {"t": "run", "v": PROTOCOL_VERSION - 1},
        {"t": "run"},
    ],
)
def test_a_request_of_another_kind_or_version_is_refused(header: dict[str, object]) -> None:
    with pytest.raises(FrameError, match="expected a run request"):
        as_run_request(header)


def test_journal_entries_convert_one_way_only() -> None:
    call = HelperCall(name="refund", runs="caller", args=[], kwargs={}, arguments={}, line=1, code=None)
    answered = JournalEntry.for_call(call, CallReply(kind="value", value=[1, 2]))
    assert answered.to_wire() == ["refund", call.digest(), [1, 2]]
    failed = JournalEntry.for_call(call, CallReply(kind="error", error_type=None, error_message="no"))
    assert failed.failed
    assert failed.to_wire() == ["refund", call.digest(), None, "Error", "no"]
    # A call that returned None is an answer, not a failure.
    assert not JournalEntry.of("FS.list_files", "d", value=None, error=None).failed
    with pytest.raises(ValueError, match="not an answer"):
        JournalEntry.for_call(call, CallReply(kind="suspend"))


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_header_with_a_number_json_does_not_have_is_refused(constant: str) -> None:
    """Python's JSON reads these, but no strict encoder writes them: a frame carrying one could
    not be encoded again on its way on."""
    with pytest.raises(FrameError, match="not a JSON number"):
        decode_header(f'{{"t": "call", "x": [1, {constant}]}}'.encode())


def test_a_lone_surrogate_in_a_header_becomes_the_replacement_character() -> None:
    """A block may escape a lone surrogate into its frames (a result, an error, a call's key):
    decoded, it could not be encoded as UTF-8 again anywhere after (see test_turns). A pair
    stays the character it makes, and a backslash before 'ud800' stays text."""
    raw = b'{"t": "done", "results": ["a\\ud800b", "\\\\ud800", "\\ud83d\\ude00"], "k": {"\\uDC00": 1}}'
    header = decode_header(raw)
    assert header["results"] == ["a\ufffdb", "\\ud800", "\U0001f600"]
    assert header["k"] == {"\ufffd": 1}


def test_a_frame_is_read_whole_to_pass_on_unchanged() -> None:
    """The worker passes the server's frames on as they came: the bytes it read, the header it
    decoded from them, the size of the blob; a frame cut short is EOFError."""
    frame = encode_frame({"t": "run", "code": "x = 1", "workdir": "/w/c1"}, b"snapshot")
    read, write = os.pipe()
    with io.FileIO(read, "rb") as stream:
        os.write(write, frame + frame[:-1])
        os.close(write)
        header, data, blob_size = read_frame_bytes(stream)
        assert bytes(data) == frame
        assert header == {"t": "run", "code": "x = 1", "workdir": "/w/c1"}
        assert blob_size == len(b"snapshot")
        with pytest.raises(EOFError):
            read_frame_bytes(stream)
