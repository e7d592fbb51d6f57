"""File routes: round trips, listing, archives, patches, and confinement of every path."""

from __future__ import annotations

import io
import tarfile

import pytest

from sandbox_service.errors import FileNotFoundInSandboxError, InvalidRequestError, PathOutsideSandboxError


def test_bytes_round_trip_with_mode(module_sandbox):
    payload = bytes(range(256)) * 1000
    module_sandbox.write_file("/workspace/data/blob.bin", payload, mode=0o640)
    assert module_sandbox.read_file("/workspace/data/blob.bin") == payload
    assert module_sandbox.read_file("data/blob.bin") == payload  # relative to the workdir
    assert module_sandbox.exec("stat -c %a /workspace/data/blob.bin").stdout.strip() == "640"
    module_sandbox.write_file("notes.txt", "héllo")
    assert module_sandbox.exec("cat /workspace/notes.txt").stdout == "héllo"


def test_missing_file_is_404(module_sandbox):
    with pytest.raises(FileNotFoundInSandboxError):
        module_sandbox.read_file("/workspace/does/not/exist")


@pytest.mark.parametrize(
    "path", ["../../etc/passwd", "/workspace/../etc/shadow", "/etc/passwd", "/proc/1/environ", "a/../../b"]
)
def test_traversal_is_refused_with_400(module_sandbox, path):
    for call in (
        lambda: module_sandbox.read_file(path),
        lambda: module_sandbox.write_file(path, b"x"),
        lambda: module_sandbox.list_files(path),
        lambda: module_sandbox.download_dir(path),
    ):
        with pytest.raises(PathOutsideSandboxError) as info:
            call()
        assert info.value.status_code == 400


@pytest.mark.parametrize(
    "path",
    ["a" * 300 + "/x.py", "d/" + "b" * 300, "c/" * 2100 + "x.py"],
    ids=["long-directory", "long-name", "over-PATH_MAX"],
)
def test_a_path_the_filesystem_cannot_name_is_the_callers_400(module_sandbox, path):
    """A 300-character directory name made the agent's mkdir raise ENAMETOOLONG as an `internal_error` (500),
    which a harness could only read as the infrastructure's: it is the request's own fault."""
    try:
        module_sandbox.write_file(path, b"x")
    except InvalidRequestError as err:
        assert err.status_code == 400, err
    else:  # the agent walks fd by fd, so a deep path of short names may be written: then it must read back
        assert module_sandbox.read_file(path) == b"x"


def test_symlink_escape_is_refused(module_sandbox):
    module_sandbox.exec("ln -sfn /etc /workspace/etc-link && ln -sfn /etc/hostname /workspace/host-link")
    for path in ("/workspace/etc-link/passwd", "/workspace/host-link"):
        with pytest.raises(PathOutsideSandboxError):
            module_sandbox.read_file(path)
    with pytest.raises(PathOutsideSandboxError):
        module_sandbox.write_file("/workspace/etc-link/evil", b"x")


def test_list_files(module_sandbox):
    module_sandbox.exec(
        "mkdir -p /workspace/tree/sub && printf 12345 > /workspace/tree/f.txt && ln -sfn f.txt /workspace/tree/l"
    )
    entries = {e.name: e for e in module_sandbox.list_files("/workspace/tree")}
    assert set(entries) == {"sub", "f.txt", "l"}
    assert entries["sub"].type == "dir" and entries["f.txt"].type == "file" and entries["l"].type == "symlink"
    assert entries["f.txt"].size == 5 and entries["f.txt"].modified_at.year >= 2024


def test_directory_upload_and_download_as_tar(module_sandbox, tmp_path):
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "README").write_text("readme\n")
    module_sandbox.upload_dir(src, "/workspace/uploaded")
    assert (
        module_sandbox.exec("cat /workspace/uploaded/pkg/mod.py /workspace/uploaded/README").stdout == "X = 1\nreadme\n"
    )
    with tarfile.open(fileobj=io.BytesIO(module_sandbox.download_dir("/workspace/uploaded")), mode="r:gz") as tar:
        names = {m.name.lstrip("./") for m in tar.getmembers()}
    assert {"pkg/mod.py", "README"} <= names


def test_tar_members_escaping_the_target_are_refused(module_sandbox):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(PathOutsideSandboxError):
        module_sandbox.client.request(
            "PUT",
            f"/v1/sandboxes/{module_sandbox.id}/files/archive",
            params={"path": "/workspace/t"},
            content=buf.getvalue(),
        )
    assert module_sandbox.exec("ls /workspace/escaped.txt /escaped.txt 2>/dev/null").stdout == ""


_PATCH = """\
--- a/hello.py
+++ b/hello.py
@@ -1,2 +1,2 @@
 def greet():
-    return "hello"
+    return "hello, world"
"""


def test_apply_patch_success_and_failure(module_sandbox):
    module_sandbox.write_file("/workspace/p/hello.py", 'def greet():\n    return "hello"\n')
    result = module_sandbox.apply_patch(_PATCH, cwd="/workspace/p")
    assert result.applied and result.exit_code == 0
    assert 'return "hello, world"' in module_sandbox.read_text("/workspace/p/hello.py")
    again = module_sandbox.apply_patch(_PATCH, cwd="/workspace/p")  # no longer applies
    assert not again.applied and again.exit_code != 0 and (again.stderr or again.stdout)
    assert 'return "hello, world"' in module_sandbox.read_text("/workspace/p/hello.py")
    with pytest.raises(PathOutsideSandboxError):
        module_sandbox.apply_patch(_PATCH, cwd="/workspace/../etc")
