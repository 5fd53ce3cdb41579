"""callbacks.reln: ActivationPatterns and HiddenMDS fire inside a real fit, record what they say,
log images and write their PNGs without overwriting a user's file."""
from __future__ import annotations

import pytest
import torch

from callbacks.reln import ActivationPatterns, HiddenMDS
from datamodules.contexts import Contexts
from tests.conftest import quiet_trainer
from zoo import reln
from zoo.gdln import Comparison, GDLN, ReLUNet
from zoo.init import Gaussian

pytestmark = pytest.mark.usefixtures("one_thread")


def _tags(folder) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return set(acc.Tags()["images"]) | set(acc.Tags()["scalars"])


@pytest.mark.slow
def test_activation_patterns_records_clusters_and_picks_an_elbow(tmp_path):
    dm = Contexts(3, "same", batches_per_epoch=6)  # 6 steps x 500 epochs
    model = ReLUNet(hidden=[40], ensemble=2, init=Gaussian(sigma=7.142857e-06), lr=1e-3, epochs_per_step=500)
    cb = ActivationPatterns(every_n_epochs=1000, ks=[1, 2, 3, 4], n_hidden=10)
    trainer = quiet_trainer(tmp_path, [cb], existing=("reln_gates.png",))
    trainer.fit(model, datamodule=dm)
    assert cb.result["epochs"] == [0, 1000, 2000, 3000]  # epoch 0 and every 1000
    # the recorded rows are the module's own patterns at the end (2 members x 40 units)
    assert torch.equal(cb.history['rows'][-1].bool(), reln.pattern_rows(model.activation_patterns(dm.X)[0]).bool())
    assert [C.shape for C in cb.result["centroids"]] == [(k, 24) for k in (1, 2, 3, 4)]
    assert len(cb.result["errors"]) == 4 and cb.result["elbow_k"] in (1, 2, 3, 4)
    assert cb.result["elbow_k"] == reln.elbow([1, 2, 3, 4], cb.result["errors"])
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "reln_gates.png").read_bytes() == b"a user's file"
    assert (folder / "reln_gates_1.png").stat().st_size > 0
    tags = _tags(folder)
    assert {"reln/centroids/k4", "reln/imitation_error/k4", "reln/elbow_k"} <= tags


def test_elbow_of_a_two_layer_net_uses_the_depth_reln(tmp_path):
    """Layer 1 of a two-hidden-layer net: the GDLN per k is a DepthGDLN ([H] Sec. 6). k = 1's error
    is recomputed here from a DepthGDLN built directly with every unit on."""
    from zoo.gdln_depth import DepthGDLN
    from zoo.theory.gdln import Gating

    dm = Contexts(3, "same", batches_per_epoch=4)  # 4 steps x 100 epochs
    init = Gaussian(sigma=0.05)
    model = ReLUNet(hidden=[12, 12], ensemble=2, init=init, lr=1e-3, epochs_per_step=100, seed=3)
    cb = ActivationPatterns(every_n_epochs=200, ks=[1, 2], layer=1, n_hidden=6)
    trainer = quiet_trainer(tmp_path, [cb])
    trainer.fit(model, datamodule=dm)
    assert len(cb.result["errors"]) == 2 and cb.result["elbow_k"] in (1, 2)
    # k = 1 thresholds to one pathway on for every point (most second-layer units are on most of the time)
    assert bool((reln.threshold_centroids(cb.result["centroids"][0]) > 0).all())
    X, Y = dm.X, dm.Y
    ref = DepthGDLN(gating="found", n_shared=12, n_hidden=6, init=init, ensemble=2, lr=1e-3, seed=3)
    ref.set_gating(Gating(torch.ones(24, 1), torch.ones(1, X.shape[1]), torch.tensor([True])))
    ref.build(X, Y)
    outs = reln.train_outputs(ref, X, Y, cb.result["epochs"])
    assert cb.result["errors"][0] == pytest.approx(reln.imitation_error(torch.stack(cb.history['outputs']).double(), outs))
    # layer 0 is the ReLN's shared linear layer: no elbow there, only the centroids
    with pytest.warns(UserWarning, match="elbow gates the last hidden layer"):
        cb0 = ActivationPatterns(every_n_epochs=200, ks=[1, 2], layer=0)
        quiet_trainer(tmp_path / "l0", [cb0]).fit(
            ReLUNet(hidden=[12, 12], ensemble=2, init=init, lr=1e-3, epochs_per_step=100), datamodule=dm)
    assert cb0.result["errors"] == [] and cb0.result["elbow_k"] is None


def test_activation_patterns_needs_a_relu_net(tmp_path):
    dm = Contexts(3, "same")
    with pytest.raises(TypeError, match="ReLUNet"):
        quiet_trainer(tmp_path, [ActivationPatterns()]).fit(GDLN(epochs_per_step=5), datamodule=dm)
    with pytest.raises(ValueError, match="ks"):
        ActivationPatterns(ks=[0, 2])


def test_hidden_mds_of_a_two_unit_layer_is_exact(tmp_path):
    # A 2-unit hidden layer is a configuration in the plane: classical MDS must reproduce its
    # pairwise distances exactly (float64 round-off on float32 activity: 1e-5 relative).
    dm = Contexts(3, "same", batches_per_epoch=3)
    relu = ReLUNet(hidden=[2], ensemble=1, init=Gaussian(sigma=0.5), lr=1e-3, seed=2)
    gdln = GDLN(gating="reln", n_hidden=5, ensemble=1, init=Gaussian(sigma=0.1))
    model = Comparison([relu, gdln], names=["ReLU", "ReLN"], epochs_per_step=10)
    cb = HiddenMDS(every_n_steps=10, model="ReLU")  # epochs
    trainer = quiet_trainer(tmp_path, [cb], existing=("hidden_mds.png",))
    trainer.fit(model, datamodule=dm)
    assert [e for e, _ in cb.records] == [0, 10, 20, 30]
    D = reln.pairwise_distances(relu.hidden_activity(dm.X)[-1])[0]
    coords = cb.records[-1][1]
    assert torch.allclose(reln.pairwise_distances(coords), D, atol=1e-5 * float(D.max()))
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "hidden_mds.png").read_bytes() == b"a user's file"
    assert (folder / "hidden_mds_1.png").stat().st_size > 0
    assert {"mds/ReLU", "mds/ReLU/explained"} <= _tags(folder)
