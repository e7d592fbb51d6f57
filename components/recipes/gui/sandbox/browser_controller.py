"""Long-running browser controller inside the sandbox: one Chromium, driven by Playwright.

Started once per episode (as a background job); each harness tool call is then one short exec of
`ctl.py`, which sends a JSON request over a Unix socket and prints the JSON answer. Keeping the
browser alive is what makes a step cost a few hundred milliseconds instead of a browser start.

Observations are compact page text: visible text by block, and each interactive element as
`[id] role "label" ...`; the ids are `data-oid` attributes stamped on the live DOM at every read, so
`click`/`type` address exactly what the policy saw. Navigation is limited to loopback URLs (the
sandbox network is loopback-only anyway; this gives the policy a clear error instead of a hang).

    python browser_controller.py --socket /workspace/.gui/ctl.sock --start-url http://127.0.0.1:8080/
"""

from __future__ import annotations

import argparse
import json
import os
import socketserver
import tempfile
import time
from typing import SupportsIndex, SupportsInt
from urllib.parse import urljoin, urlparse

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("ORCHARD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
MAX_PAGE_CHARS = 3000

# Walks the DOM once: block elements start new lines, table cells are joined with " | ", interactive
# elements are stamped with data-oid and rendered as [id] role "label".
SNAPSHOT_JS = r"""
() => {
  let next = 1; const lines = []; let cur = [];
  const BLOCK = new Set(['P','DIV','H1','H2','H3','H4','LI','TR','UL','OL','TABLE','FORM','NAV','FIELDSET',
                         'LEGEND','SECTION','HEADER','MAIN','FOOTER','BR','TEXTAREA']);
  const flush = () => { const s = cur.join(' ').replace(/\s+/g, ' ').trim(); if (s) lines.push(s); cur = []; };
  const labelOf = (el) => {
    if (el.getAttribute('aria-label')) return el.getAttribute('aria-label');
    if (el.id) { const l = document.querySelector(`label[for="${el.id}"]`); if (l) return l.innerText.trim(); }
    if (el.tagName === 'INPUT' && (el.type === 'checkbox' || el.type === 'radio') && el.parentElement.tagName === 'LABEL')
      return el.parentElement.innerText.trim();
    return el.getAttribute('placeholder') || el.getAttribute('name') || (el.innerText || el.value || '').trim();
  };
  const visible = (el) => { const s = getComputedStyle(el); return s.display !== 'none' && s.visibility !== 'hidden'; };
  const describe = (el) => {
    const t = el.tagName, type = (el.getAttribute('type') || '').toLowerCase();
    const q = (s) => JSON.stringify(String(s).replace(/\s+/g, ' ').trim());
    if (t === 'A') return `link ${q(el.innerText)}`;
    if (t === 'BUTTON' || (t === 'INPUT' && (type === 'submit' || type === 'button')))
      return `button ${q(labelOf(el))}`;
    if (t === 'SELECT') {
      const opts = [...el.options].map(o => o.text.trim());
      return `select ${q(labelOf(el))} value=${q(el.options[el.selectedIndex]?.text || '')} options=${JSON.stringify(opts)}`;
    }
    if (t === 'INPUT' && (type === 'checkbox' || type === 'radio')) return `${type} ${q(labelOf(el))} checked=${el.checked}`;
    return `textbox ${q(labelOf(el))} value=${q(el.value)}`;
  };
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { cur.push(node.textContent); return; }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const el = node, t = el.tagName;
    if (['SCRIPT','STYLE','HEAD','NOSCRIPT'].includes(t) || !visible(el)) return;
    if (t === 'INPUT' && (el.type || '').toLowerCase() === 'hidden') return;
    const interactive = ['A','BUTTON','SELECT','TEXTAREA','INPUT'].includes(t);
    if (interactive) {
      const id = next++; el.setAttribute('data-oid', String(id));
      cur.push(`[${id}] ${describe(el)}`);
      return;  // an element's own text is already in its label
    }
    if (t === 'LABEL' && el.querySelector('input[type=checkbox],input[type=radio]')) {
      for (const c of el.children) walk(c); return;  // the checkbox already carries the label text
    }
    const block = BLOCK.has(t);
    if (block) flush();
    for (const c of el.childNodes) { walk(c); if (t === 'TR' && c.nodeType === Node.ELEMENT_NODE) cur.push('|'); }
    if (block) flush();
  };
  document.querySelectorAll('[data-oid]').forEach(e => e.removeAttribute('data-oid'));
  walk(document.body); flush();
  return lines.map(l => l.replace(/\s*\|\s*$/, '')).join('\n');
}
"""


# Every field a request may carry and its JSON types (bool is not an int here): checked before any action,
# so a wrongly typed request is the policy's error (`ok: false`) and never a dropped connection.
_REQUEST_TYPES: dict[str, tuple[type, ...]] = {
    "action": (str,),
    "element_id": (int,),
    "text": (str,),
    "submit": (bool,),
    "direction": (str,),
    "amount": (int,),
    "url": (str,),
    "path": (str,),
}


class Browser:
    def __init__(self, start_url: str, profile_dir: str):
        self.pw = sync_playwright().start()
        # launch_persistent_context is how Playwright takes a fresh --user-data-dir.
        self.ctx = self.pw.chromium.launch_persistent_context(
            profile_dir,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1024, "height": 768},
        )
        self.page = self.ctx.pages[0] if self.ctx.pages else self.ctx.new_page()
        self.page.set_default_timeout(10_000)
        self.start_url = start_url
        deadline = time.monotonic() + 30
        while True:  # the site server starts alongside us; wait for it rather than fail the episode
            try:
                self.page.goto(start_url)
                break
            except PlaywrightError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def snapshot(self) -> str:
        text = self.page.evaluate(SNAPSHOT_JS)
        if len(text) > MAX_PAGE_CHARS:
            text = text[:MAX_PAGE_CHARS] + "\n... (page truncated)"
        return f"URL: {self.page.url}\nTitle: {self.page.title()}\n{text}"

    def element(self, element_id: object):
        try:
            if not isinstance(element_id, (str, bytes, bytearray, SupportsInt, SupportsIndex)):  # what int() takes
                raise TypeError
            oid = int(element_id)
        except (TypeError, ValueError):
            raise ValueError(f"element_id must be an integer from the page view, got {element_id!r}") from None
        loc = self.page.locator(f'[data-oid="{oid}"]')
        if loc.count() == 0:
            raise ValueError(f"no element [{oid}] on the current page; call read_page for fresh ids")
        return loc.first

    def settle(self) -> None:
        try:
            self.page.wait_for_load_state("load", timeout=5_000)
        except PlaywrightError:
            pass  # a slow page is the page's problem; the snapshot shows what is there

    def handle(self, req: dict) -> dict:
        if not isinstance(req, dict):
            raise ValueError("a request is a JSON object")
        for key, value in req.items():
            kinds = _REQUEST_TYPES.get(key)
            if kinds is None:
                raise ValueError(f"unknown field {key!r}")
            if type(value) not in kinds or (type(value) is int and not -100_000 <= value <= 100_000):
                raise ValueError(
                    f"{key} must be {' or '.join(k.__name__ for k in kinds)} (in range), got {type(value).__name__}"
                )
        action = req.get("action")
        if action == "ping":
            return {"ok": True, "url": self.page.url}
        if action == "read_page":
            return {"ok": True, "page": self.snapshot()}
        if action == "navigate":
            url = urljoin(self.page.url, str(req.get("url", "")))
            host = urlparse(url).hostname
            if urlparse(url).scheme not in ("http", "https") or host not in ("127.0.0.1", "localhost"):
                raise ValueError(f"can only open the task's local sites (http://127.0.0.1:...), not {url!r}")
            self.page.goto(url)
        elif action == "click":
            el = self.element(req.get("element_id"))
            el.click()
            self.settle()
        elif action == "type":
            el = self.element(req.get("element_id"))
            text = str(req.get("text", ""))
            tag = el.evaluate("e => e.tagName")
            if tag == "SELECT":
                try:
                    el.select_option(label=text, timeout=2_000)
                except PlaywrightError:
                    raise ValueError(f"select has no option {text!r}; use one of the listed options") from None
            else:
                el.fill(text)
            if req.get("submit"):
                el.press("Enter")
                self.settle()
        elif action == "scroll":
            if req.get("direction", "down") not in ("up", "down"):
                raise ValueError("direction must be up or down")
            dy = req.get("amount", 600) * (-1 if req.get("direction") == "up" else 1)
            self.page.mouse.wheel(0, dy)
            self.page.wait_for_timeout(100)
        elif action == "screenshot":
            path = str(req["path"])
            self.page.screenshot(path=path)
            return {"ok": True, "path": path, "url": self.page.url}
        else:
            raise ValueError(f"unknown action {action!r}")
        return {"ok": True, "page": self.snapshot()}


def serve(browser: Browser, socket_path: str) -> None:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            try:
                req = json.loads(self.rfile.readline(1 << 20))
                resp = browser.handle(req)
            except (ValueError, KeyError, TypeError, RecursionError) as err:  # the request's fault: the policy's
                resp = {"ok": False, "error": str(err)[:300]}
            except PlaywrightError as err:  # timeouts, detached elements: also reported to the policy
                resp = {"ok": False, "error": str(err).splitlines()[0][:300]}
            except Exception as err:  # noqa: BLE001 - our own failure: answered (never a dropped connection)
                resp = {
                    "ok": False,
                    "error": f"controller error: {type(err).__name__}: {err}"[:300],
                    "controller_error": True,
                }
            self.wfile.write((json.dumps(resp) + "\n").encode())

    if os.path.exists(socket_path):
        os.unlink(socket_path)
    # Sequential on purpose: Playwright's sync API is single-threaded and one episode = one policy.
    with socketserver.UnixStreamServer(socket_path, Handler) as server:
        server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--start-url", required=True)
    ap.add_argument("--profile-dir", default=None, help="fresh --user-data-dir (default: a new temp dir)")
    args = ap.parse_args()
    profile = args.profile_dir or tempfile.mkdtemp(prefix="chromium-profile-")
    serve(Browser(args.start_url, profile), args.socket)


if __name__ == "__main__":
    main()
