"""The helper answers first and destroys the probe's VM right after, before the next request."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from hv_device_plugin.probe_worker import serve

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/kvm"), reason="needs /dev/kvm")


def _vm_fds() -> int:
    count = 0
    for entry in Path("/proc/self/fd").iterdir():
        try:
            if str(entry.readlink()) == "anon_inode:kvm-vm":
                count += 1
        except OSError:
            continue
    return count


class _Recorder(io.BytesIO):
    """The response stream: notes how many VMs were alive whenever an answer is flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.alive_at_flush: list[int] = []

    def flush(self) -> None:
        self.alive_at_flush.append(_vm_fds())
        super().flush()


def test_vm_is_closed_after_the_answer_and_before_the_next_request() -> None:
    request = {"kind": "kvm", "device_path": "/dev/kvm", "host_view_path": None}
    lines = b"".join(json.dumps({**request, "id": i}).encode() + b"\n" for i in (1, 2, 3))
    responses = _Recorder()
    before = _vm_fds()
    assert serve(io.BytesIO(lines), responses, test_mode=False) == 0
    answers = [json.loads(line) for line in responses.getvalue().splitlines()]
    assert [a["ok"] for a in answers] == [True, True, True], answers
    # One VM alive at each answer: the previous one was gone before the next probe.
    assert responses.alive_at_flush == [before + 1] * 3
    assert _vm_fds() == before, "no VM outlives serve()"


def test_a_failing_write_still_closes_the_vm() -> None:
    class Broken(io.BytesIO):
        def flush(self) -> None:
            raise BrokenPipeError("parent went away")

    before = _vm_fds()
    line = json.dumps({"id": 1, "kind": "kvm", "device_path": "/dev/kvm", "host_view_path": None})
    with pytest.raises(BrokenPipeError):
        serve(io.BytesIO(line.encode() + b"\n"), Broken(), test_mode=False)
    assert _vm_fds() == before
