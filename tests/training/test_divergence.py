"""zoo.training.divergence: which members and steps a DivergenceError names, one decision for all ranks."""
from __future__ import annotations

import json
import math
import os
import socket
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zoo.training.divergence import DivergenceError, check_finite, drop_diverged

NAN, INF = math.nan, math.inf


def test_finite_losses_pass_and_a_nan_names_its_member():
    check_finite(torch.tensor([1.0, 2.0]), step=3, labels=["a", "b"], hint="h")
    with pytest.raises(DivergenceError, match=r"not finite at step 3 for ensemble member\(s\) b: .* h$"):
        check_finite(torch.tensor([1.0, NAN]), step=3, labels=["a", "b"], hint="h")


def test_stacked_steps_name_the_first_step_each_member_diverged():
    # rows are steps 10, 11, 12: member a goes inf at 11 (and stays), c NaN at 12, b never
    losses = torch.tensor([[1.0, 1.0, 1.0], [INF, 1.0, 1.0], [NAN, 1.0, NAN]])
    with pytest.raises(DivergenceError, match=r"at steps 11-12 for ensemble member\(s\) a, c:"):
        check_finite(losses, step=10, labels=["a", "b", "c"], hint="")
    with pytest.raises(DivergenceError, match=r"at step 12 for ensemble member\(s\) c:"):
        check_finite(losses[:, 1:], step=10, labels=["b", "c"], hint="")


def test_a_dropped_member_warns_once_and_the_last_one_raises():
    alive = torch.tensor([True, True, False])
    with pytest.warns(RuntimeWarning, match=r"member\(s\) b diverged at step 4"):
        left = drop_diverged(torch.tensor([1.0, NAN, NAN]), alive, step=4, labels=["a", "b", "c"], hint="")
    assert left.tolist() == [True, False, False]  # c was out already: no second warning for it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert drop_diverged(torch.tensor([1.0, NAN, NAN]), left, step=5, labels=["a", "b", "c"], hint="").equal(left)
    with pytest.raises(DivergenceError, match=r"every remaining ensemble member \(a\)"):
        drop_diverged(torch.tensor([INF, 1.0, 1.0]), left, step=6, labels=["a", "b", "c"], hint="")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, folder: str) -> None:
    """Rank 0 holds members a, b (finite), rank 1 holds c (NaN at the second step) of the ensemble
    a, b, c; both pass the whole ensemble's labels, as a sharded module does."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))  # a hang fails
    labels = ["a", "b", "c"]
    mine = torch.tensor([[1.0, 2.0], [1.0, 2.0]]) if rank == 0 else torch.tensor([[1.0], [NAN]])
    out = []
    try:
        check_finite(mine, step=7, labels=labels, hint="")
        out.append("no error")
    except DivergenceError as e:
        out.append(str(e))
    # rank 1's only member drops out; rank 0's survive: nobody raises, rank 0 warns for the run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alive = torch.ones(mine.shape[1], dtype=torch.bool)
        out.append(drop_diverged(mine[1], alive, step=8, labels=labels, hint="").tolist())
    out.append([str(w.message) for w in caught])
    dist.barrier()  # both ranks got here: no rank waits in a collective the other skipped
    dist.destroy_process_group()
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(out))


def test_two_ranks_take_one_decision_and_name_the_other_ranks_member(tmp_path):
    # fork: the children need no new interpreter (the tensors are tiny: one thread, no OpenMP pool)
    mp.start_processes(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="fork", join=True)
    for rank in (0, 1):
        error, survivors, warned = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "not finite at step 8 for ensemble member(s) c:" in error  # rank 0 raised too, for rank 1's member
        assert survivors == ([True, True] if rank == 0 else [False])
        assert len(warned) == (1 - rank) and (rank == 1 or "member(s) c diverged at step 8" in warned[0])
