"""The GUI site server as a real HTTP server on loopback, driven with plain HTTP (no browser):
its state file is what the verifiers read."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from components.recipes.gui.tasks import generate_tasks
from components.recipes.gui.verify import verify_state

SERVER = Path(__file__).parents[2] / "components/recipes/gui/sandbox/site_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def site(tmp_path, request):
    task = generate_tasks("train", 1, families=(request.param,))[0]
    (tmp_path / "data.json").write_text(json.dumps(task.metadata["site"]))
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SERVER),
            "--data",
            str(tmp_path / "data.json"),
            "--state",
            str(tmp_path / "state.json"),
            "--port",
            str(port),
        ]
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(base + "/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        with httpx.Client(base_url=base, follow_redirects=True, timeout=5) as http:
            yield task, http, lambda: json.loads((tmp_path / "state.json").read_text())
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("site", ["shop_checkout"], indirect=True)
def test_shop_checkout_state_resolves_and_wrong_item_does_not(site):
    task, http, state = site
    exp = task.verifier.expected
    assert verify_state(state(), None, exp).resolved is False  # nothing done
    page = http.get("/search", params={"q": exp["query"], "color": exp["color"], "sort": "price_asc"}).text
    assert exp["product_name"] in page
    wrong = next(p for p in task.metadata["site"]["products"] if p["id"] != exp["product_id"])
    http.post("/cart/add", data={"product": wrong["id"]})
    cart = http.post("/cart/add", data={"product": exp["product_id"]}).text
    assert "Proceed to checkout" in cart and state()["cart"] == [wrong["id"], exp["product_id"]]
    http.post("/cart/remove", data={"index": "0"})
    missing = http.post("/checkout", data={"name": "", "address": "x", "shipping": exp["shipping"]}).text
    assert "Please enter your full name" in missing and state()["orders"] == []
    done = http.post("/checkout", data={"name": exp["name"], "address": exp["address"], "shipping": exp["shipping"]})
    assert "Order confirmed" in done.text and state()["cart"] == []
    assert verify_state(state(), None, exp).resolved
    http.post("/cart/add", data={"product": wrong["id"]})
    http.post("/checkout", data={"name": exp["name"], "address": exp["address"], "shipping": exp["shipping"]})
    assert not verify_state(state(), None, exp).resolved  # a second order is a failure


@pytest.mark.parametrize("site", ["form_register"], indirect=True)
def test_form_validation_and_submission(site):
    task, http, state = site
    exp = task.verifier.expected
    bad = http.post("/register", data={"name": exp["name"], "email": "not-an-email"}).text
    assert "is not a valid address" in bad and state()["submissions"] == []
    form = {
        "name": exp["name"],
        "email": exp["email"],
        "ticket": exp["ticket"],
        "comments": exp["comments"],
        "workshop": exp["workshops"],
    }
    assert "Registration received" in http.post("/register", data=form).text
    assert verify_state(state(), None, exp).resolved


@pytest.mark.parametrize("site", ["info_lookup"], indirect=True)
def test_info_site_pages_hold_the_answer(site):
    task, http, _ = site
    exp = task.verifier.expected
    page = http.get(f"/city/{exp['city'].lower()}" if exp["question"] != "largest" else f"/region/{exp['region']}")
    assert page.status_code == 200 and exp["answer"] in page.text.replace(",", "")
    assert http.post("/anything").status_code == 405
    assert http.get("/nope").status_code == 404
