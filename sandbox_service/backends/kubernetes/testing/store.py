"""The fake API server's object store (`kubernetes_fake`): a dict keyed (kind, namespace, name) that
keeps the indexes a real API server's storage has, so that the fake's own work per request does not
grow with the number of objects and the scale simulation measures the backend, not the fake.

- by (kind, namespace): a LIST reads only its kind (etcd keys are prefixed by resource and namespace);
- by label (key, value) per (kind, namespace): an equality label selector starts from the smallest
  matching set (the API server's watch cache indexes labels the same way);
- by owner uid: the garbage collector finds a deleted owner's dependents without scanning everything
  (Kubernetes' garbage collector keeps an owner -> dependents graph for the same reason).

Writing `store[key] = obj` (re)indexes the object from what it holds now, so an object changed in place
(a PATCH merges into it) must be written back to keep the indexes true; `kubernetes_fake` does that.
What an object was indexed under is kept beside it, so re-indexing removes exactly the old entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

Key = tuple[str, str, str]  # (kind, namespace, name)


def owner_uids(obj: dict) -> frozenset[str]:
    return frozenset(ref["uid"] for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("uid"))


class ObjectStore(dict):
    """dict[Key, dict] plus indexes; `on_add(key)` is called for each key that was not there before."""

    def __init__(self, items: dict | None = None, *, on_add: Callable[[Key], None] = lambda key: None) -> None:
        super().__init__()
        self._on_add = on_add
        self._by_kind: dict[tuple[str, str], dict[str, None]] = {}  # (kind, ns) -> names (insertion-ordered)
        self._by_label: dict[tuple[str, str, str, str], set[str]] = {}  # (kind, ns, label, value) -> names
        self._by_owner: dict[str, set[Key]] = {}  # owner uid -> dependents
        self._indexed: dict[Key, tuple[tuple[tuple[str, str], ...], frozenset[str]]] = {}  # key -> (labels, owners)
        self._seq: dict[Key, int] = {}  # key -> when it was added (creation order, as a dict's iteration keeps)
        self._added = 0
        for key, obj in (items or {}).items():
            self[key] = obj

    def __setitem__(self, key: Key, obj: dict) -> None:
        new = key not in self
        if not new:
            self._unindex(key)
        super().__setitem__(key, obj)
        kind, ns, name = key
        labels = tuple(sorted((obj.get("metadata", {}).get("labels") or {}).items()))
        owners = owner_uids(obj) if "metadata" in obj else frozenset()
        self._indexed[key] = (labels, owners)
        self._by_kind.setdefault((kind, ns), {})[name] = None
        for label, value in labels:
            self._by_label.setdefault((kind, ns, label, value), set()).add(name)
        for uid in owners:
            self._by_owner.setdefault(uid, set()).add(key)
        if new:
            self._added += 1
            self._seq[key] = self._added
            self._on_add(key)

    def __delitem__(self, key: Key) -> None:
        super().__delitem__(key)
        self._unindex(key)
        del self._seq[key]
        kind, ns, name = key
        names = self._by_kind[(kind, ns)]
        del names[name]
        if not names:
            del self._by_kind[(kind, ns)]

    def _unindex(self, key: Key) -> None:
        kind, ns, name = key
        labels, owners = self._indexed.pop(key)
        for label, value in labels:
            index = (kind, ns, label, value)
            self._by_label[index].discard(name)
            if not self._by_label[index]:
                del self._by_label[index]
        for uid in owners:
            self._by_owner[uid].discard(key)
            if not self._by_owner[uid]:
                del self._by_owner[uid]

    def _unsupported(self, *args, **kwargs):
        raise TypeError("ObjectStore: write with store[key] = obj or del store[key] (the indexes follow those)")

    pop = popitem = clear = update = setdefault = __ior__ = _unsupported

    # -- queries ------------------------------------------------------------------------------------
    def of(self, kind: str, ns: str | None = None) -> list[dict]:
        """Every object of `kind` (in `ns`, or in every namespace), in creation order per namespace."""
        spaces = [ns] if ns is not None else [n for k, n in self._by_kind if k == kind]
        return [self[(kind, n, name)] for n in spaces for name in self._by_kind.get((kind, n), ())]

    def labelled(self, kind: str, ns: str, selector: dict[str, str]) -> Iterator[dict]:
        """Candidates for an equality label selector: the objects holding its rarest term (all of
        `kind` in `ns` when it is empty), in creation order. The caller still checks every term."""
        names = self._by_kind.get((kind, ns), {})
        if selector:
            sets = [self._by_label.get((kind, ns, label, value), set()) for label, value in selector.items()]
            rarest = min(sets, key=len)
            if len(rarest) * 4 > len(names):  # most of the namespace: walking it in order is cheaper
                return (self[(kind, ns, name)] for name in names if name in rarest)
            return (self[(kind, ns, name)] for name in sorted(rarest, key=lambda name: self._seq[(kind, ns, name)]))
        return (self[(kind, ns, name)] for name in names)

    def dependents(self, uid: str) -> list[Key]:
        """Keys of the objects whose ownerReferences name `uid` (as last written to the store)."""
        return sorted(self._by_owner.get(uid, ()))
