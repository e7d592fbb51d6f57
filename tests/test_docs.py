"""The documentation site builds with `mkdocs build --strict` (what `make docs` runs), and strict mode does catch a
broken link: the same build over a copy of docs/ with one bad link in it fails, naming the link."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]  # not --quiet: it hides the warnings strict counts

pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]') is not installed")
pytest.importorskip("material", reason="the docs extra (pip install -e '.[docs]') is not installed")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        MKDOCS + ["--config-file", str(config), "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _config_over(docs: Path, tmp_path: Path) -> Path:
    """mkdocs.yml as committed, pointed at another docs directory (hooks resolved from the repository)."""
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.SafeLoader)
    config["docs_dir"] = str(docs)
    config["hooks"] = [str(REPO / h) for h in config["hooks"]]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_site_builds_strict(tmp_path):
    result = _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    reference = (tmp_path / "site" / "api" / "reference" / "index.html").read_text()
    assert "/v1/sandboxes/{sandbox_id}/exec" in reference  # the reference is generated from the OpenAPI schema


def test_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    with (docs / "getting-started.md").open("a") as f:
        f.write("\nSee [a page that does not exist](no-such-page.md).\n")
    result = _build(_config_over(docs, tmp_path), tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr


def test_readme_links_stay_inside_the_repository():
    import re

    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#]+)", readme):
        if target.startswith("http"):
            continue
        assert (REPO / target).resolve().is_relative_to(REPO) and (REPO / target).exists(), target
