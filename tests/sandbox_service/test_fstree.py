"""Tree removal and measurement without recursion (sandbox_service/backends/fstree.py)."""

from __future__ import annotations

import os

from sandbox_service.backends import fstree


def _chain(root, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "wb") as f:
            f.write(b"xy")
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.symlink("/", "up", dir_fd=fd)
    os.mkdir("locked", 0, dir_fd=fd)
    os.close(fd)


def test_deep_trees_are_measured_and_removed_without_following_links(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("must survive")
    tree = tmp_path / "tree"
    tree.mkdir()
    try:
        _chain(tree, 1100)  # beyond Python's recursion limit
        os.symlink(outside, tree / "link-out")
        assert fstree.tree_size(tree) == 2 * 1100
        fstree.remove_tree(tree)
        assert not tree.exists() and (outside / "keep").read_text() == "must survive"
    finally:  # pytest's own clean-up of old temp dirs recurses: never leave a deep tree behind
        fstree.remove_tree(tree)
    fstree.remove_tree(tree)  # a missing tree is fine


def test_a_tree_that_cannot_be_removed_is_quarantined(tmp_path, monkeypatch):
    tree = tmp_path / "s" / "sb-x"
    tree.mkdir(parents=True)
    (tree / "f").write_text("x")

    def refuse(path):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(fstree, "remove_tree", refuse)
    where = fstree.remove_or_quarantine(tree, tmp_path / "quarantine")
    assert where is not None and where.startswith(str(tmp_path / "quarantine" / "sb-x-"))
    assert not tree.exists() and (tmp_path / "quarantine").iterdir()


def _chown_deepest(root, depth: int, uid: int | None) -> int:
    """Give the file at the bottom of a `_chain` to `uid` (None: leave it); returns its owner."""
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth - 1):
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    try:
        if uid is not None:
            os.chown("f", uid, uid, dir_fd=fd)
        return os.stat("f", dir_fd=fd).st_uid
    finally:
        os.close(fd)


def test_a_deep_tree_is_handed_to_another_id_range_without_following_links(tmp_path):
    """A snapshot forked into another sandbox's id range: os.walk recursed (RecursionError near 1,000 levels),
    so one deep directory chain made every fork of the snapshot fail."""
    old, new, size = 200_000, 300_000, 65_536
    outside = tmp_path / "outside"
    outside.write_text("not the sandbox's")
    os.chown(outside, old + 5, old + 5)
    tree = tmp_path / "tree"
    tree.mkdir()
    try:
        _chain(tree, 1100)
        suid = tree / "suid"
        suid.write_text("x")
        os.chown(suid, old + 1, old + 2)
        os.chmod(suid, 0o6755)
        os.symlink(outside, tree / "link-out")
        os.chown(tree / "link-out", old + 3, old + 3, follow_symlinks=False)
        other = tree / "host-owned"
        other.write_text("x")
        os.chown(other, 1000, 1000)  # outside the old range: left as it is
        for path in (tree, tree / "d"):
            os.chown(path, old, old)
        _chown_deepest(tree, 1100, old + 7)
        fstree.shift_owners(tree, old, new, size)
        assert (os.stat(tree).st_uid, os.stat(tree / "d").st_gid) == (new, new)
        st = os.stat(suid)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (new + 1, new + 2, 0o6755)
        assert os.lstat(tree / "link-out").st_uid == new + 3 and os.stat(outside).st_uid == old + 5
        assert os.stat(other).st_uid == 1000
        assert _chown_deepest(tree, 1100, None) == new + 7  # the file at the bottom of the chain too
    finally:
        fstree.remove_tree(tree)
