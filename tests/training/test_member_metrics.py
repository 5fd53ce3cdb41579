"""Per-member evaluation metrics of a sharded ensemble (``zoo.training.distributed.set_metric_sync``,
``MemberParallel.member_metrics``): while each process holds a slice of the members, a metric's
states are that slice's and must not be summed over the processes (the zoo gathers the computed
values instead); once the members are whole again (one process, data-parallel) they reduce
across processes as torchmetrics does.
"""
from __future__ import annotations

import pytest
import torch
from helpers_ddp import in_process_group
from torch import nn
from torchmetrics import Metric
from torchmetrics.aggregation import SumMetric
from torchmetrics.regression import MeanSquaredError

from zoo.training.distributed import member_bounds, set_metric_sync


def _twice(t: torch.Tensor, group=None) -> list[torch.Tensor]:
    """A stand-in for the gather over 2 processes whose states are equal."""
    _twice.calls += 1
    return [t, t.clone()]


def test_a_local_metric_computes_its_own_states_and_syncs_again():
    available = lambda: True  # noqa: E731 (as if a process group were up)
    metric = SumMetric(distributed_available_fn=available, dist_sync_fn=_twice)
    metric.update(torch.tensor([1.0, 2.5]))
    _twice.calls = 0
    assert float(metric.compute()) == 7.0 and _twice.calls == 1  # torchmetrics syncs: 3.5 on each of 2 ranks

    assert set_metric_sync(metric, sync=False) is metric
    set_metric_sync(metric, sync=False)  # idempotent
    metric.reset()
    metric.update(torch.tensor([1.0, 2.5]))
    _twice.calls = 0
    assert float(metric.compute()) == 3.5 and _twice.calls == 0  # its own states, no gather

    set_metric_sync(metric, sync=True)
    assert metric.distributed_available_fn is available  # the function it had, put back
    metric.reset()
    metric.update(torch.tensor([1.0, 2.5]))
    assert float(metric.compute()) == 7.0 and _twice.calls == 1


def test_every_metric_in_a_container_is_set():
    mse = [MeanSquaredError(num_outputs=2) for _ in range(4)]
    nested = {"a": nn.ModuleDict({"val": nn.ModuleList([mse[0], mse[1]])}), "b": (mse[2], [mse[3]])}
    set_metric_sync(nested, sync=False)
    assert [m.distributed_available_fn() for m in mse] == [False] * 4
    set_metric_sync(nested, sync=True)
    assert all(m.distributed_available_fn is mse[0].distributed_available_fn for m in mse)  # torchmetrics' own
    with pytest.raises(TypeError, match="metrics = int; allowed: a torchmetrics Metric"):
        set_metric_sync(3, sync=False)


def _members(name: str):
    """A tiny ensemble of 3 members of each module that keeps per-member metrics."""
    from zoo import DeepLinearNet
    from zoo.init import Gaussian, Imbalance, LambdaBalanced, Polar
    from zoo.models.sae import SparseAutoencoder
    from zoo.models.student import MultiHeadStudent
    from zoo.models.vae import BetaVAESweep

    if name == "deep_linear":
        return DeepLinearNet(dims=[2, 2, 2], init=LambdaBalanced(lam=[-1.0, 0.0, 1.0]))
    if name == "sae":
        return SparseAutoencoder(d=3, n=4, init=Imbalance(v=[1.0, 2.0, 4.0]))
    if name == "vae":
        return BetaVAESweep(seeds=[0, 1, 2], latent_dim=2, encoder_widths=[4], decoder_widths=[4])
    return MultiHeadStudent(d=6, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=[0.0, 0.1, 0.2]))


def _metrics(net) -> list[Metric]:
    """The metrics the module evaluates with (a sweep's members hold their own, unused in it)."""
    if hasattr(net, "val_mse"):
        held = nn.ModuleList([net.val_mse, net.test_mse])
    elif isinstance(getattr(net, "eval_metrics", None), nn.Module):
        held = net.eval_metrics
    else:
        net._metrics("val", 0)  # MultiHeadModule builds its metrics at the first evaluation batch
        held = net.eval_store
    metrics = [m for m in held.modules() if isinstance(m, Metric)]
    assert metrics
    return metrics


@pytest.mark.parametrize("name", ["deep_linear", "sae", "vae", "multihead"])
def test_a_sharded_module_keeps_its_metrics_local_and_whole_again_syncs(name, monkeypatch):
    net = _members(name)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # as on a rank of a run
    assert all(m.distributed_available_fn() for m in _metrics(net))
    net.keep_members(1, 3)
    assert [m.distributed_available_fn() for m in _metrics(net)] == [False] * len(_metrics(net))
    net.member_range = None  # what all_members_back leaves, after gathering the members
    net.on_all_members_back()
    assert all(m.distributed_available_fn() for m in _metrics(net))


def _sae():
    from zoo.init import Imbalance
    from zoo.models.sae import SparseAutoencoder

    return SparseAutoencoder(d=4, n=8, l1=[0.0, 0.1, 0.2], init=Imbalance(v=[1.0, 2.0, 4.0], sigma=0.5))


DATA = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))


def _measures(net) -> dict[str, torch.Tensor]:
    from zoo.models.sae import MEASURES

    counts, reconstruction = net.eval_metrics["val"]
    out = {**counts.compute(), **reconstruction.compute()}
    return {k: out[k].float().reshape(-1) for k in MEASURES}


def _sae_rank(rank: int, world: int) -> dict:
    net = _sae()
    net.keep_members(*member_bounds(3, world, rank))  # 2 members here and 1 there
    net.evaluate_batch((DATA,), "val")  # every rank the same batch, as member-parallel
    sharded = {k: net.all_member_values(v) for k, v in _measures(net).items()}
    net.all_members_back()
    net.evaluate_batch((DATA[rank::world],), "val")  # each rank its half, as data-parallel
    return {"sharded": sharded, "whole": _measures(net)}


def test_on_two_processes_sharded_metrics_are_each_ranks_and_whole_ones_sum(tmp_path):
    from zoo.models.sae import MEASURES

    ranks = in_process_group(tmp_path, _sae_rank)
    reference = {k: v.float() for k, v in _sae().measure(DATA).items()}
    half = {k: v.float() for k, v in _sae().measure(DATA[0::2]).items()}
    for out in ranks:
        for k in MEASURES:
            # sharded: each member's measures from the whole batch, the members' own arithmetic
            torch.testing.assert_close(out["sharded"][k], reference[k], rtol=1e-6, atol=0, msg=k)
            # whole again: the sums of both halves, so the measures of all the data
            torch.testing.assert_close(out["whole"][k], reference[k], rtol=1e-6, atol=0, msg=k)
    # rank 0's half alone gives other numbers: the comparison above tells a synced metric from a local one
    assert not torch.allclose(half["mse"], reference["mse"], rtol=1e-3)
