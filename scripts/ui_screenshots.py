"""Screenshots of the MLflow pages of a finished run, in a real browser, for the docs (docs/images/ui-*.png).

    python scripts/ui_screenshots.py --runs-dir runs --out docs/images

Serves the runs directory's store through `orchard ui` (pipelines/ui.py, any free port), opens the link it
prints in Debian's Chromium (headless, through Playwright) and saves: the experiment's runs table
(`ui-runs-table.png`), the latest pipeline run's page (`ui-parent-run.png`: description, datasets, registered
models), one resolved evaluation episode of the SFT model as a trace with its verification span open
(`ui-trace.png`: the turns, the tool calls, the diff), and the registered version's card when one exists
(`ui-model-version.png`). The server stops when it is done. Prints what it saved.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def shoot(runs_dir: Path, out: Path, chromium: str) -> list[Path]:
    import mlflow
    from playwright.sync_api import sync_playwright

    from pipelines.ui import latest_pipeline_run, serve, store_uri

    uri = store_uri(runs_dir, None)
    experiment, run = latest_pipeline_run(uri)
    client = mlflow.MlflowClient(uri)
    parent = client.get_run(run)
    traces = client.search_traces(locations=[experiment], filter_string="tags.`orchard.stage` = 'evaluate-sft'")
    resolved = [t for t in traces if t.info.tags.get("orchard.outcome") == "resolved"] or traces
    registered = parent.data.tags.get("orchard.registered_model")
    out.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []

    def pages(link: str, _server) -> int:
        base = link.split("/#/")[0]
        with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                profile,
                executable_path=chromium,
                headless=True,
                args=CHROMIUM_FLAGS,
                viewport={"width": 1600, "height": 1000},
            )
            page = browser.new_page()

            def save(name: str, url: str, *texts: str, click: str | None = None) -> None:
                page.goto(url)
                for text in texts:
                    page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
                assistant = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
                if assistant.count():  # MLflow 3.17 opens its chat panel on first load: the page, not the panel
                    assistant.first.click()
                if click:
                    page.get_by_text(click, exact=True).first.click()
                    page.wait_for_timeout(1500)
                page.wait_for_timeout(1500)  # charts and lazy panels settle
                page.screenshot(path=str(out / name))
                saved.append(out / name)

            save("ui-runs-table.png", link, parent.info.run_name, "Model registry")
            save(
                "ui-parent-run.png",
                f"{base}/#/experiments/{experiment}/runs/{run}?workflowType=machine_learning",
                "orchard",
                "Registered models",
            )
            if resolved:
                save(
                    "ui-trace.png",
                    f"{base}/#/experiments/{experiment}/traces/{resolved[0].info.trace_id}",
                    "episode",
                    "verification",
                    click="verification",
                )
            if registered:
                name, version = registered.split("/")
                save("ui-model-version.png", f"{base}/#/models/{name}/versions/{version}", "Agent policy", "Limits")
            browser.close()
        return 0

    serve(runs_dir, port=0, browser=False, on_ready=pages)
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", default="runs", type=Path)
    parser.add_argument("--out", default="docs/images", type=Path)
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args(argv)
    if not args.chromium:
        print("no chromium found (apt-get install chromium), or pass --chromium", file=sys.stderr)
        return 2
    for path in shoot(args.runs_dir, args.out, args.chromium):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
