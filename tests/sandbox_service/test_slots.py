"""Machine-wide slots: the lowest free one is taken, by any service on the machine, never twice."""

from __future__ import annotations

import concurrent.futures

import pytest

from sandbox_service.backends.local.slots import MachineSlots
from sandbox_service.errors import BackendUnavailableError


def test_the_lowest_free_slot_is_taken_and_a_released_one_is_taken_again(tmp_path):
    slots = MachineSlots(tmp_path / "slots", 8, "test slots")
    assert [slots.acquire(f"owner-{i}") for i in range(4)] == [0, 1, 2, 3]
    slots.release(1, "owner-1")
    slots.release(2, "someone else")  # not its owner: kept
    assert slots.acquire("owner-new") == 1
    assert slots.owner(1) == "owner-new" and slots.owner(2) == "owner-2"
    assert slots.acquire("owner-5") == 4


def test_two_services_never_get_the_same_slot(tmp_path):
    """Two MachineSlots on one directory stand for two services: 64 acquires from 8 threads each, no slot twice."""
    first, second = (MachineSlots(tmp_path / "slots", 200, "test slots") for _ in range(2))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        taken = list(pool.map(lambda i: (first if i % 2 else second).acquire(f"o{i}"), range(128)))
    assert sorted(taken) == list(range(128))


def test_a_full_directory_says_what_is_exhausted(tmp_path):
    slots = MachineSlots(tmp_path / "slots", 2, "test slots")
    slots.acquire("a"), slots.acquire("b")
    with pytest.raises(BackendUnavailableError, match="all 2 test slots"):
        slots.acquire("c")
