"""callbacks.reln: ActivationPatterns and HiddenMDS fire inside a real fit, record what they say,
log images and write their PNGs without overwriting a user's file."""
from __future__ import annotations

import pytest
import torch

from callbacks.reln import ActivationPatterns, HiddenMDS
from datamodules.contexts import Contexts
from helpers_fit import trainer as quiet
from zoo.models import reln
from zoo.models.gdln import Comparison, GDLN, ReLUNet
from zoo.init import Gaussian



def _tags(folder) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return set(acc.Tags()["images"]) | set(acc.Tags()["scalars"])


@pytest.mark.slow
def test_activation_patterns_records_and_clusters(tmp_path):
    dm = Contexts(3, "same", batches_per_epoch=6)  # 6 steps x 500 epochs
    model = ReLUNet(hidden=[40], ensemble=2, init=Gaussian(sigma=7.142857e-06), lr=1e-3, epochs_per_step=500)
    cb = ActivationPatterns(every_n_epochs=1000, ks=[1, 2, 3, 4], n_init=2)
    trainer = quiet(tmp_path, logger=True, callbacks=[cb], existing=("reln_gates.png",))
    trainer.fit(model, datamodule=dm)
    assert cb.result["epochs"] == cb.history["epochs"] == [0, 1000, 2000, 3000]  # epoch 0 and every 1000
    # the recorded rows are the module's own patterns at the end (2 members x 40 units), the outputs its outputs
    assert torch.equal(cb.history['rows'][-1].bool(), reln.pattern_rows(model.activation_patterns(dm.X)[0]).bool())
    assert torch.equal(cb.history["outputs"][-1], model(dm.X).detach())
    # the centroids are the k-means of all the rows; no GDLN is trained here (phase 2: zoo.models.reln_imitation)
    rows = torch.cat(cb.history["rows"]).float()
    assert cb.result["ks"] == [1, 2, 3, 4] and "errors" not in cb.result
    for k, C in zip(cb.result["ks"], cb.result["centroids"]):
        assert torch.equal(C, reln.cluster_patterns(rows, k, n_init=2))
    # what phase 2 reads in the checkpoint besides the record: which network and layer
    state = cb.state_dict()
    assert (state["network"], state["network_index"], state["layer"], state["n_layers"]) == ("ReLUNet", 0, 0, 1)
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "reln_gates.png").read_bytes() == b"a user's file"
    assert (folder / "reln_gates_1.png").stat().st_size > 0
    tags = _tags(folder)
    assert "reln/centroids/k4" in tags and not any(t.startswith("reln/imitation_error") for t in tags)


def test_activation_patterns_needs_a_relu_net(tmp_path):
    dm = Contexts(3, "same")
    with pytest.raises(TypeError, match="ReLUNet"):
        quiet(tmp_path, logger=True, callbacks=[ActivationPatterns()]).fit(GDLN(epochs_per_step=5), datamodule=dm)
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
    trainer = quiet(tmp_path, logger=True, callbacks=[cb], existing=("hidden_mds.png",))
    trainer.fit(model, datamodule=dm)
    assert [e for e, _ in cb.records] == [0, 10, 20, 30]
    D = reln.pairwise_distances(relu.hidden_activity(dm.X)[-1])[0]
    coords = cb.records[-1][1]
    assert torch.allclose(reln.pairwise_distances(coords), D, atol=1e-5 * float(D.max()))
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "hidden_mds.png").read_bytes() == b"a user's file"
    assert (folder / "hidden_mds_1.png").stat().st_size > 0
    assert {"mds/ReLU", "mds/ReLU/explained"} <= _tags(folder)
