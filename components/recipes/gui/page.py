"""Parse the controller's compact page text back into elements (used by the scripted teacher and
tests; a learned policy reads the text itself).

    URL: http://127.0.0.1:8080/search?q=mug
    Title: Results for 'mug'
    [1] link "Home" [2] link "Cart (0)" [3] textbox "Search products" value="" [4] button "Search"
    Red Classic Mug | $4.20 | red | [9] button "Add Red Classic Mug to cart"
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlparse

_ELEMENT = re.compile(r'\[(\d+)\] (link|button|select|textbox|checkbox|radio) "((?:[^"\\]|\\.)*)"')
_VALUE = re.compile(r'^\s*value="((?:[^"\\]|\\.)*)"')
_CHECKED = re.compile(r"^\s*checked=(true|false)")
_OPTIONS = re.compile(r"options=(\[.*?\])(?=\s*$|\s+\[\d+\])")


@dataclass
class Element:
    id: int
    role: str
    label: str
    value: str | None = None
    checked: bool | None = None
    options: list[str] = field(default_factory=list)


@dataclass
class PageView:
    url: str
    title: str
    text: str
    elements: list[Element]

    @property
    def path(self) -> str:
        return urlparse(self.url).path

    @property
    def query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlparse(self.url).query).items()}

    def find(self, role: str, label: str | None = None, *, prefix: str | None = None) -> Element | None:
        for el in self.elements:
            if (
                el.role == role
                and (label is None or el.label == label)
                and (prefix is None or el.label.startswith(prefix))
            ):
                return el
        return None

    def find_all(self, role: str, *, prefix: str = "") -> list[Element]:
        return [el for el in self.elements if el.role == role and el.label.startswith(prefix)]


def _unquote(s: str) -> str:
    return json.loads(f'"{s}"')


def parse_page(text: str) -> PageView | None:
    """The page in an observation, or None when the observation is not a page view."""
    if not text.startswith("URL: "):
        return None
    lines = text.split("\n")
    url = lines[0][5:].strip()
    title = lines[1][7:].strip() if len(lines) > 1 and lines[1].startswith("Title:") else ""
    elements = []
    for line in lines[2:]:
        matches = list(_ELEMENT.finditer(line))
        for i, m in enumerate(matches):
            rest = line[m.end() : matches[i + 1].start() if i + 1 < len(matches) else len(line)]
            el = Element(id=int(m.group(1)), role=m.group(2), label=_unquote(m.group(3)))
            if (v := _VALUE.match(rest)) is not None:
                el.value = _unquote(v.group(1))
            if (c := _CHECKED.match(rest)) is not None:
                el.checked = c.group(1) == "true"
            if (o := _OPTIONS.search(rest)) is not None:
                try:
                    el.options = json.loads(o.group(1))
                except json.JSONDecodeError:
                    pass
            elements.append(el)
    return PageView(url=url, title=title, text=text, elements=elements)
