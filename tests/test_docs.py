"""The documentation: the README stays a short front page, and the docs site builds with strict link checks
(a broken link, a missing anchor or a page outside the nav fails here, not for a reader)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_is_short_and_points_only_inside_the_repository():
    text = (REPO / "README.md").read_text()
    assert text.count("\n") <= 200
    links = re.findall(r"\]\(([^)#]+)", text)
    assert links, "the README links into the docs"
    for link in links:
        assert not link.startswith(("../", "/")) and "://" not in link, link
        assert (REPO / link).exists(), f"README links to a missing file: {link}"


def test_the_docs_site_builds_with_strict_link_checking(tmp_path):
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=REPO, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "/v1/sandboxes/{sandbox_id}/exec" in api and "SandboxCreate" in api  # generated from the OpenAPI schema
