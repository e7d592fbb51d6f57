"""The task's local website, served inside the sandbox on 127.0.0.1 (stdlib only).

One program renders three kinds of site from a generated `data.json`: a shop (search, filters,
cart, checkout), a form-heavy registration site, and an information site (regions and cities).
Plain HTML forms, no JavaScript, so every state change is a server-side POST. The server keeps
its state in memory and rewrites `state.json` atomically after every change: the verifier reads
that file after the episode (the agent has no shell, only the browser, so it cannot edit it).

    python site_server.py --data /workspace/site/data.json --state /workspace/site/state.json --port 8080
"""

from __future__ import annotations

import argparse
import html
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse

E = html.escape


def page(title: str, body: str, nav: str = "") -> bytes:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{E(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:900px;margin:16px auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px}.err{color:#b00}nav a{margin-right:12px}</style>"
        f"</head><body><nav>{nav}</nav><h1>{E(title)}</h1>{body}</body></html>"
    ).encode()


class Site:
    """The site's data (read-only) and state (what the agent changed)."""

    def __init__(self, data_path: str, state_path: str):
        with open(data_path) as f:
            self.data = json.load(f)
        self.state_path = state_path
        self.state: dict[str, list] = {"cart": [], "orders": [], "submissions": [], "visits": []}
        self.lock = threading.Lock()
        self.save()

    def save(self) -> None:
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=1)
        os.replace(tmp, self.state_path)  # the verifier never sees a half-written file

    # -- shop ------------------------------------------------------------------------------------
    def product(self, pid: str) -> dict | None:
        return next((p for p in self.data["products"] if p["id"] == pid), None)

    def shop_nav(self) -> str:
        n = len(self.state["cart"])
        return (
            f"<a href='/'>Home</a><a href='/cart'>Cart ({n})</a>"
            "<form action='/search' method='get' style='display:inline'>"
            "<input name='q' aria-label='Search products' placeholder='Search products'>"
            "<button type='submit'>Search</button></form>"
        )

    def shop_home(self) -> bytes:
        cats = "".join(
            f"<li><a href='/search?{urlencode({'category': c})}'>{E(c.title())}</a></li>"
            for c in self.data["categories"]
        )
        return page(self.data["title"], f"<h2>Categories</h2><ul>{cats}</ul>", self.shop_nav())

    def shop_search(self, q: dict[str, str]) -> bytes:
        query, color, cat = q.get("q", "").strip().lower(), q.get("color", ""), q.get("category", "")
        sort, max_price = q.get("sort", "relevance"), q.get("max_price", "").strip()
        items = [
            p
            for p in self.data["products"]
            if (not query or all(w in p["name"].lower() for w in query.split()))
            and (not color or p["color"] == color)
            and (not cat or p["category"] == cat)
        ]
        err = ""
        if max_price:
            try:
                items = [p for p in items if p["price"] <= float(max_price)]
            except ValueError:
                err = f"<p class='err'>Max price must be a number, got {E(max_price)!r}.</p>"
        if sort == "price_asc":
            items.sort(key=lambda p: p["price"])
        elif sort == "price_desc":
            items.sort(key=lambda p: -p["price"])
        colors = "".join(
            f"<option value='{c}'{' selected' if c == color else ''}>{c.title() or 'Any color'}</option>"
            for c in [""] + self.data["colors"]
        )
        sorts = "".join(
            f"<option value='{k}'{' selected' if k == sort else ''}>{v}</option>"
            for k, v in [
                ("relevance", "Relevance"),
                ("price_asc", "Price: low to high"),
                ("price_desc", "Price: high to low"),
            ]
        )
        filters = (
            "<form action='/search' method='get'>"
            f"<input type='hidden' name='q' value='{E(query)}'><input type='hidden' name='category' value='{E(cat)}'>"
            f"<label>Color <select name='color' aria-label='Color'>{colors}</select></label> "
            f"<label>Max price <input name='max_price' aria-label='Max price' value='{E(max_price)}'></label> "
            f"<label>Sort <select name='sort' aria-label='Sort'>{sorts}</select></label> "
            "<button type='submit'>Apply filters</button></form>"
        )
        rows = "".join(
            f"<tr><td>{E(p['name'])}</td><td>${p['price']:.2f}</td><td>{E(p['color'])}</td><td>"
            f"<form action='/cart/add' method='post'><input type='hidden' name='product' value='{p['id']}'>"
            f"<button type='submit' aria-label='Add {E(p['name'])} to cart'>Add to cart</button></form></td></tr>"
            for p in items
        )
        table = (
            f"<table><tr><th>Product</th><th>Price</th><th>Color</th><th></th></tr>{rows}</table>"
            if items
            else "<p>No products match.</p>"
        )
        title = f"Results for '{query}'" if query else (cat.title() if cat else "All products")
        return page(title, err + filters + f"<p>{len(items)} products</p>" + table, self.shop_nav())

    def shop_cart(self) -> bytes:
        rows, total = "", 0.0
        for i, pid in enumerate(self.state["cart"]):
            p = self.product(pid)
            assert p is not None  # the cart only takes products that exist (/cart/add)
            total += p["price"]
            rows += (
                f"<tr><td>{E(p['name'])}</td><td>${p['price']:.2f}</td><td>"
                f"<form action='/cart/remove' method='post'><input type='hidden' name='index' value='{i}'>"
                f"<button type='submit' aria-label='Remove {E(p['name'])}'>Remove</button></form></td></tr>"
            )
        if not rows:
            return page("Your cart", "<p>Your cart is empty.</p>", self.shop_nav())
        body = f"<table>{rows}</table><p>Subtotal: ${total:.2f}</p><a href='/checkout'>Proceed to checkout</a>"
        return page("Your cart", body, self.shop_nav())

    def shop_checkout(self, error: str = "") -> bytes:
        if not self.state["cart"]:
            return page("Checkout", "<p>Your cart is empty.</p>", self.shop_nav())
        opts = "".join(
            f"<option value='{s['id']}'>{E(s['label'])} (${s['price']:.2f})</option>" for s in self.data["shipping"]
        )
        body = (
            (f"<p class='err'>{E(error)}</p>" if error else "") + "<form action='/checkout' method='post'>"
            "<p><label>Full name <input name='name' aria-label='Full name'></label></p>"
            "<p><label>Address <input name='address' aria-label='Address'></label></p>"
            f"<p><label>Shipping <select name='shipping' aria-label='Shipping'>{opts}</select></label></p>"
            "<button type='submit'>Place order</button></form>"
        )
        return page("Checkout", body, self.shop_nav())

    def shop_post(self, path: str, form: dict[str, str]) -> tuple[int, str | bytes]:
        if path == "/cart/add":
            if not self.product(form.get("product", "")):
                return 400, page("Error", "<p>Unknown product.</p>", self.shop_nav())
            self.state["cart"].append(form["product"])
            return 303, "/cart"
        if path == "/cart/remove":
            idx = int(form.get("index", "-1"))
            if 0 <= idx < len(self.state["cart"]):
                self.state["cart"].pop(idx)
            return 303, "/cart"
        if path == "/checkout":
            name, address = form.get("name", "").strip(), form.get("address", "").strip()
            if not self.state["cart"]:
                return 200, self.shop_checkout()
            if not name or not address:
                return 200, self.shop_checkout("Please enter your full name and address.")
            self.state["orders"].append(
                {"items": list(self.state["cart"]), "shipping": form.get("shipping"), "name": name, "address": address}
            )
            self.state["cart"] = []
            return 303, f"/order/{len(self.state['orders'])}"
        return 404, page("Not found", "<p>No such page.</p>", self.shop_nav())

    # -- forms -----------------------------------------------------------------------------------
    def form_page(self, error: str = "") -> bytes:
        d = self.data
        tickets = "".join(f"<option value='{t}'>{E(t)}</option>" for t in d["tickets"])
        workshops = "".join(
            f"<p><label><input type='checkbox' name='workshop' value='{E(w)}'> {E(w)} workshop</label></p>"
            for w in d["workshops"]
        )
        body = (
            (f"<p class='err'>{E(error)}</p>" if error else "")
            + f"<p>Register for {E(d['event'])}.</p><form action='/register' method='post'>"
            "<p><label>Full name <input name='name' aria-label='Full name'></label></p>"
            "<p><label>Email <input name='email' aria-label='Email'></label></p>"
            f"<p><label>Ticket type <select name='ticket' aria-label='Ticket type'>{tickets}</select></label></p>"
            f"<fieldset><legend>Workshops</legend>{workshops}</fieldset>"
            "<p><label>Comments <textarea name='comments' aria-label='Comments'></textarea></label></p>"
            "<button type='submit'>Submit registration</button></form>"
        )
        return page(d["title"], body, "<a href='/'>Registration</a>")

    def form_post(self, path: str, form: dict[str, str], multi: dict[str, list[str]]) -> tuple[int, str | bytes]:
        if path != "/register":
            return 404, page("Not found", "<p>No such page.</p>")
        name, email = form.get("name", "").strip(), form.get("email", "").strip()
        if not name:
            return 200, self.form_page("Full name is required.")
        if "@" not in email or "." not in email.split("@")[-1]:
            return 200, self.form_page(f"Email {email!r} is not a valid address.")
        self.state["submissions"].append(
            {
                "name": name,
                "email": email,
                "ticket": form.get("ticket"),
                "workshops": sorted(multi.get("workshop", [])),
                "comments": form.get("comments", ""),
            }
        )
        return 303, f"/registered/{len(self.state['submissions'])}"

    # -- info ------------------------------------------------------------------------------------
    def info_nav(self) -> str:
        return "<a href='/'>Directory home</a>"

    def info_get(self, path: str) -> tuple[int, bytes]:
        d = self.data
        if path == "/":
            regions = "".join(f"<li><a href='/region/{r['slug']}'>{E(r['name'])} region</a></li>" for r in d["regions"])
            return 200, page(d["title"], f"<p>Browse cities by region.</p><ul>{regions}</ul>", self.info_nav())
        for r in d["regions"]:
            if path == f"/region/{r['slug']}":
                rows = "".join(
                    f"<tr><td><a href='/city/{c['slug']}'>{E(c['name'])}</a></td><td>{c['population']:,}</td></tr>"
                    for c in d["cities"]
                    if c["region"] == r["slug"]
                )
                body = f"<table><tr><th>City</th><th>Population</th></tr>{rows}</table>"
                return 200, page(f"{r['name']} region", body, self.info_nav())
        for c in d["cities"]:
            if path == f"/city/{c['slug']}":
                facts = "".join(
                    f"<tr><th>{E(k)}</th><td>{E(str(v))}</td></tr>"
                    for k, v in [
                        ("Population", f"{c['population']:,}"),
                        ("Founded", c["founded"]),
                        ("Mayor", c["mayor"]),
                        ("Region", c["region"].title()),
                    ]
                )
                return 200, page(c["name"], f"<table>{facts}</table>", self.info_nav())
        return 404, page("Not found", "<p>No such page.</p>", self.info_nav())


def make_handler(site: Site) -> type[BaseHTTPRequestHandler]:
    kind = site.data["site"]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: the exec log is not the place for this
            pass

        def _send(self, status: int, body: str | bytes) -> None:
            if status in (302, 303):
                assert isinstance(body, str)  # a redirect's body is its location
                self.send_response(status)
                self.send_header("Location", body)
                self.end_headers()
                return
            assert isinstance(body, bytes)  # any other answer is a page
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            with site.lock:
                site.state["visits"].append(self.path)
                if url.path == "/state.json":  # only for humans debugging; the verifier reads the file
                    return self._send(404, page("Not found", ""))
                if kind == "shop":
                    routes = {"/": site.shop_home, "/cart": site.shop_cart, "/checkout": site.shop_checkout}
                    if url.path in routes:
                        return self._send(200, routes[url.path]())
                    if url.path == "/search":
                        return self._send(200, site.shop_search(q))
                    if url.path.startswith("/order/"):
                        return self._send(
                            200,
                            page(
                                "Order confirmed",
                                f"<p>Thank you! Order #{E(url.path[7:])} has been placed.</p>",
                                site.shop_nav(),
                            ),
                        )
                elif kind == "forms":
                    if url.path == "/":
                        return self._send(200, site.form_page())
                    if url.path.startswith("/registered/"):
                        return self._send(
                            200, page("Registration received", f"<p>Registration #{E(url.path[12:])} is confirmed.</p>")
                        )
                elif kind == "info":
                    return self._send(*site.info_get(url.path))
                return self._send(404, page("Not found", "<p>No such page.</p>"))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            multi = parse_qs(self.rfile.read(length).decode(), keep_blank_values=True)
            form = {k: v[-1] for k, v in multi.items()}
            path = urlparse(self.path).path
            with site.lock:
                if kind == "shop":
                    status, body = site.shop_post(path, form)
                elif kind == "forms":
                    status, body = site.form_post(path, form, multi)
                else:
                    status, body = 405, page("Not allowed", "<p>This site is read-only.</p>")
                site.save()
            self._send(status, body)

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args()
    site = Site(args.data, args.state)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(site))
    print(f"serving {site.data['site']} on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
