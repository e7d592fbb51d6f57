"""The fake API server's indexes (kubernetes_fake_store) answer exactly what a scan of every object
answers, through writes, rewrites after in-place changes and deletes; and its kubelet visits only the
pods whose transition is due when the kubelet says when that is (the scale simulation's kubelet)."""

from __future__ import annotations

import random
import time

from sandbox_service.backends.kubernetes.testing.fake import FakeKubernetesAPI, _matches
from sandbox_service.backends.kubernetes.testing.store import ObjectStore


def _obj(name: str, labels: dict, owners: list[str]) -> dict:
    return {"metadata": {"name": name, "labels": labels, "ownerReferences": [{"uid": u} for u in owners]}}


def test_indexed_queries_match_a_full_scan_through_random_writes():
    rng = random.Random(3)
    store, plain = ObjectStore(), {}
    kinds, spaces, names = ["pods", "secrets"], ["a", "b"], [f"n{i}" for i in range(40)]
    values = ["x", "y", "z"]
    for step in range(3000):
        key = (rng.choice(kinds), rng.choice(spaces), rng.choice(names))
        action = rng.random()
        if action < 0.15 and key in plain:
            del store[key]
            del plain[key]
        elif action < 0.3 and key in plain:  # changed in place, then written back (as a PATCH does)
            obj = plain[key]
            obj["metadata"]["labels"] = {"sid": rng.choice(values)} if rng.random() < 0.5 else {}
            obj["metadata"]["ownerReferences"] = [{"uid": rng.choice(values)}]
            store[key] = obj
        else:
            obj = _obj(
                key[2], {"sid": rng.choice(values), "app": rng.choice(values)}, rng.sample(values, rng.randint(0, 2))
            )
            store[key] = obj
            plain[key] = obj
        if step % 50 == 0:
            assert dict(store) == plain and list(store) == list(plain)
            for kind in kinds:
                assert len(store.of(kind)) == sum(k == kind for k, _, _ in plain)
                for ns in spaces:
                    assert store.of(kind, ns) == [o for (k, n, _), o in plain.items() if k == kind and n == ns]
                    for selector in ({}, {"sid": "x"}, {"sid": "y", "app": "z"}, {"app": "nope"}):
                        scan = [o for (k, n, _), o in plain.items() if k == kind and n == ns and _matches(o, selector)]
                        indexed = [o for o in store.labelled(kind, ns, selector) if _matches(o, selector)]
                        assert indexed == scan, (kind, ns, selector)  # same objects, same (creation) order
                        if len(selector) == 1:  # one term: the index alone answers it (no stale entries)
                            assert list(store.labelled(kind, ns, selector)) == scan
            for uid in values:
                assert store.dependents(uid) == sorted(
                    k for k, o in plain.items() if any(r["uid"] == uid for r in o["metadata"]["ownerReferences"])
                )


def test_writes_the_indexes_cannot_follow_are_refused():
    store = ObjectStore({("pods", "a", "n"): _obj("n", {}, [])})
    for write in (lambda: store.pop(("pods", "a", "n")), lambda: store.update({}), store.clear):
        try:
            write()
        except TypeError:
            continue
        raise AssertionError("an unindexed write went through")
    assert len(store) == 1


def test_a_plain_dict_assigned_to_objects_is_indexed():
    fake = FakeKubernetesAPI(validate=False)
    try:
        fake.objects = {("pods", "orchard", "p"): _obj("p", {"k": "v"}, ["u"])}
        assert fake._list("pods", "orchard", {"labelSelector": ["k=v"]})[0]["metadata"]["name"] == "p"
        with fake.lock:
            fake._gc("u")
        assert fake.objects == {}
    finally:
        fake.close()


def test_the_kubelet_visits_a_pod_when_its_revisit_says_not_every_tick():
    class Kubelet:
        def __init__(self):
            self.visits: dict[str, int] = {}

        def __call__(self, pod, ticks):
            name = pod["metadata"]["name"]
            self.visits[name] = self.visits.get(name, 0) + 1
            return {"phase": "Running" if self.visits[name] >= 2 else "Pending"}

        def revisit(self, pod):
            return None if pod["status"]["phase"] == "Running" else 0.3

    fake = FakeKubernetesAPI(validate=False, tick_seconds=0.01)
    fake.kubelet = kubelet = Kubelet()
    try:
        with fake.lock:
            for i in range(50):
                fake.objects[("pods", "orchard", f"p{i}")] = {"metadata": {"name": f"p{i}"}, "status": {}}
        time.sleep(0.2)
        assert set(kubelet.visits.values()) == {1}  # each seen once, then not before 0.3 s (20 ticks later)
        time.sleep(0.6)
        assert set(kubelet.visits.values()) == {2}  # once more at 0.3 s, then Running: never again
        assert all(p["status"]["phase"] == "Running" for p in fake.of_kind("pods"))
    finally:
        fake.close()
