"""Archive extraction on Pythons without tarfile's filters (< 3.11.4), as the agent runs in Kubernetes pods.

The injected interpreter of the offline agent image is Debian bookworm's 3.11.2: forks of a snapshot on
the test cluster failed there (`tarfile` has no `FilterError`). The agent now applies the same checks
itself when the interpreter lacks them; these tests run extraction with the filters removed.
"""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from sandbox_service.agent import files


def _tar(*members: tarfile.TarInfo, data: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            payload = (data or {}).get(m.name)
            if payload is not None:
                m.size = len(payload)
            tar.addfile(m, io.BytesIO(payload) if payload is not None else None)
    return buf.getvalue()


def _member(name: str, kind=tarfile.REGTYPE, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


@pytest.fixture
def old_python(monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter")
    monkeypatch.delattr(tarfile, "FilterError")


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    return files.Confinement(str(ws), str(ws))


def test_extraction_works_without_tarfiles_filters(old_python, workspace):
    blob = _tar(
        _member("a.txt"),
        _member("bin/run", mode=0o4755),
        _member("link", tarfile.SYMTYPE, "a.txt"),
        data={"a.txt": b"A", "bin/run": b"#!/bin/sh\n"},
    )
    assert files.put_archive(workspace, "out", blob) == 3
    out = os.path.join(workspace.root, "out")
    assert open(os.path.join(out, "a.txt"), "rb").read() == b"A"
    assert os.readlink(os.path.join(out, "link")) == "a.txt"
    assert os.stat(os.path.join(out, "bin/run")).st_mode & 0o7777 == 0o755  # setuid dropped, execute kept


@pytest.mark.parametrize(
    "member",
    [
        _member("../escape.txt"),
        _member("sub/../../escape.txt"),
        _member("out", tarfile.SYMTYPE, "/etc"),
        _member("sub/up", tarfile.SYMTYPE, "../../.."),
        _member("hard", tarfile.LNKTYPE, "../../etc/passwd"),
        _member("dev", tarfile.CHRTYPE),
        _member("fifo", tarfile.FIFOTYPE),
    ],
    ids=lambda m: m.name,
)
def test_hostile_members_are_refused_without_tarfiles_filters(old_python, workspace, member):
    blob = _tar(_member("first_ok.txt"), member, data={"first_ok.txt": b"ok"})
    with pytest.raises(files.FileOpError) as caught:
        files.put_archive(workspace, "evil", blob)
    assert caught.value.code == "path_outside_sandbox"
    assert not os.path.exists(os.path.join(workspace.root, "evil", "first_ok.txt"))


def test_the_fallback_refuses_what_tarfiles_own_filter_refuses(tmp_path):
    dest = str(tmp_path)
    for member in (
        _member("../x"),
        _member("l", tarfile.SYMTYPE, "/etc"),
        _member("d", tarfile.BLKTYPE),
        _member("a/l", tarfile.SYMTYPE, "../../x"),
    ):
        with pytest.raises(tarfile.FilterError):
            tarfile.data_filter(member, dest)
        with pytest.raises(files.ArchiveMemberRefused):
            files._data_filter_fallback(member, dest)
    ok = _member("a/b.txt", mode=0o6777)
    assert files._data_filter_fallback(ok, dest).mode == tarfile.data_filter(ok, dest).mode
