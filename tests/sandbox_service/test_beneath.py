"""The agent's beneath-resolution (both the openat2 path and the O_NOFOLLOW walk used without it)."""

from __future__ import annotations

import os

import pytest

from sandbox_service.agent import beneath, files


@pytest.fixture(params=["openat2", "walk"])
def mode(request, monkeypatch):
    if request.param == "openat2" and not beneath.has_openat2():
        pytest.skip("no openat2 on this kernel")
    monkeypatch.setitem(beneath._state, "openat2", request.param == "openat2")
    return request.param


def test_escapes_are_refused_and_writes_stay_inside(tmp_path, mode):
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "real").mkdir(parents=True)
    out.mkdir()
    (out / "secret").write_text("OUTSIDE")
    (ws / "real" / "f").write_text("inside")
    os.symlink(str(out), ws / "abs")  # absolute link out
    os.symlink("../out", ws / "rel")  # relative link out
    os.symlink("/proc/self/cwd", ws / "magic")  # a magic link
    os.symlink("real", ws / "inner")  # a link that stays inside
    conf = files.Confinement(str(ws), str(ws))
    for bad in ("abs/secret", "rel/secret", "magic/secret"):
        with pytest.raises(files.FileOpError) as err:
            files.read_file(conf, bad, 1 << 20)
        assert err.value.code == "path_outside_sandbox", bad
        with pytest.raises(files.FileOpError):
            files.write_file(conf, bad.replace("secret", "new"), b"x", None)
    assert sorted(p.name for p in out.iterdir()) == ["secret"]
    if mode == "openat2":
        assert files.read_file(conf, "inner/f", 1 << 20) == b"inside"
    else:  # the walk follows no symlink at all: stricter, never looser
        with pytest.raises(files.FileOpError):
            files.read_file(conf, "inner/f", 1 << 20)
    files.write_file(conf, "a/b/c.txt", b"deep", None)
    assert (ws / "a" / "b" / "c.txt").read_bytes() == b"deep"
    fd = os.open(out, os.O_RDONLY)
    try:
        with pytest.raises(beneath.EscapeError):  # exec cwd: never through a magic link
            beneath.open_dir_path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def test_the_workspace_root_itself_lists(tmp_path, mode):
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "a.py").write_text("x = 1\n")
    conf = files.Confinement(str(ws), str(ws))
    for root in (str(ws), "."):
        assert [e["name"] for e in files.list_dir(conf, root)] == ["pkg"]
    assert [e["name"] for e in files.list_dir(conf, "pkg")] == ["a.py"]


def test_walks_leave_no_fd_open_whether_they_succeed_or_are_refused(tmp_path, mode):
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    os.symlink("/", ws / "a" / "out")
    root = beneath.open_root(str(ws))
    try:
        before = sorted(os.listdir("/proc/self/fd"))
        for _ in range(3):
            os.close(beneath.open_beneath(root, "a/b", os.O_PATH | os.O_DIRECTORY))
            os.close(beneath.make_dirs(root, "a/b/c/d"))
            with pytest.raises(beneath.EscapeError):
                beneath.open_beneath(root, "a/out/etc", os.O_PATH | os.O_DIRECTORY)
            with pytest.raises(beneath.EscapeError):
                beneath.make_dirs(root, "a/out/new")
        assert sorted(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(root)
    assert (ws / "a" / "b" / "c" / "d").is_dir() and not os.path.exists("/new")
