"""A callback's record in a checkpoint (``zoo.training.history``): each list of equal tensors stored as one
tensor, given back as the same list; everything else, and records saved before, as they are."""
from __future__ import annotations

import io

import torch

from callbacks.singular_values import SingularValues
from zoo.training.history import STACKED, packed, unpacked


def tensors_in(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(tensors_in(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensors_in(v) for v in obj)
    return 0


def saved_and_loaded(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_lists_of_equal_tensors_are_stored_as_one_and_come_back_equal():
    g = torch.Generator().manual_seed(0)
    history = {"steps": list(range(0, 500, 10)),
               "strengths": [torch.randn(5, 7, dtype=torch.float64, generator=g) for _ in range(50)],
               "losses": [torch.randn(5, generator=g) for _ in range(50)],
               "rows": [torch.ones(k, 3, dtype=torch.uint8) for k in (1, 2, 2)],  # shapes differ: kept
               "entropies": [{"H_Q": torch.tensor(0.5)}, {"H_Q": torch.tensor(0.25)}],  # not tensors: kept
               "one": [torch.zeros(2)], "none": []}
    state = saved_and_loaded(packed(history))
    assert tensors_in(state) == 2 + 3 + 2 + 1  # two stacks, the rest as they were
    assert set(state["strengths"]) == {STACKED} and isinstance(state["rows"], list)
    back = unpacked(state)
    assert back.keys() == history.keys() and back["steps"] == history["steps"]
    for key in ("strengths", "losses", "rows", "one"):
        assert len(back[key]) == len(history[key])
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(back[key], history[key]))
    assert back["entropies"] == history["entropies"] and back["none"] == []


def test_a_record_saved_as_plain_lists_loads_as_it_is():
    old = {"steps": [0, 10], "strengths": [torch.ones(2, 2), torch.zeros(2, 2)]}
    cb = SingularValues(every_n_steps=10)
    cb.load_state_dict({"history": old})
    assert cb.history["steps"] == [0, 10] and all(torch.equal(a, b) for a, b in zip(cb.history["strengths"], old["strengths"]))


def test_a_long_record_is_a_handful_of_tensors_in_the_checkpoint():
    cb = SingularValues(every_n_steps=10)
    for step in range(0, 20_000, 10):  # the quickstart's record after 20,000 steps
        cb.history["steps"].append(step), cb.history["loss_steps"].append(step)
        cb.history["strengths"].append(torch.full((5, 7), float(step), dtype=torch.float64))
        cb.history["losses"].append(torch.full((5,), float(step), dtype=torch.float64))
    state = saved_and_loaded(cb.state_dict())
    assert tensors_in(state) == 2  # against 4,000 as lists
    again = SingularValues(every_n_steps=10)
    again.load_state_dict(state)
    assert again.history["steps"] == cb.history["steps"]
    assert all(torch.equal(a, b) for a, b in zip(again.history["strengths"], cb.history["strengths"]))
    again.history["strengths"].append(torch.zeros(5, 7, dtype=torch.float64))  # the record goes on after a resume
    assert tensors_in(again.state_dict()) == 2
