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
