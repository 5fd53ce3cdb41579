"""datamodules.mnist.MNISTContinual on tiny IDX files written here, and (if present) real MNIST."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from datamodules.mnist import MNISTContinual

from tests.helpers_mnist import SHARED_RAW, TEST_PER_DIGIT, TRAIN_PER_DIGIT, idx_bytes, tiny_mnist, trace  # noqa: F401


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_digit_split_has_exactly_k_shared_digits(seed):
    dm = MNISTContinual("unused", shared=[0, 1, 2, 3, 4, 5], seed=seed)  # the split needs no files
    t1 = dm.digits[0][0]
    assert sorted(t1) == sorted(set(t1)) and len(t1) == 5
    for k, (a, b) in zip(range(6), dm.digits):
        assert a == t1 and len(set(b)) == 5 and all(0 <= d <= 9 for d in b)
        assert len(set(a) & set(b)) == k
        assert b[:k] == a[:k]  # shared digits keep their task-1 labels 0..k-1
        assert MNISTContinual("unused", shared=k, seed=seed).digits == [[a, b]]  # a single k: the same split
    assert dm.digits[5][1] == t1  # k = 5: the same task, same labels
    assert set(dm.digits[0][0]) | set(dm.digits[0][1]) == set(range(10))  # k = 0: the other five
    for k in range(5):  # nested: k -> k + 1 swaps one new digit for one of task 1's
        assert len(set(dm.digits[k][1]) & set(dm.digits[k + 1][1])) == 4


def test_seed_sets_the_digits():
    splits = {tuple(MNISTContinual("unused", shared=2, seed=s).digits[0][0]) for s in range(6)}
    assert len(splits) > 1
    assert MNISTContinual("unused", shared=2, seed=3).digits == MNISTContinual("unused", shared=2, seed=3).digits


def test_labels_follow_the_documented_order(tiny):
    dm = MNISTContinual(str(tiny), shared=[0, 3, 5], batch_size=7, steps=[9, 9], normalise=False, seed=2)
    dm.setup("fit")
    for step in range(dm.num_steps):
        b = dm.batch(step)
        task = int(b["task"])
        assert task == (0 if step < 9 else 1)
        assert b["x"].shape == (3, 7, 784) and b["y"].shape == (3, 7) and b["y"].dtype == torch.int64
        digit, _ = trace(b["x"])
        for s in range(3):
            order = dm.digits[s][task]
            assert torch.equal(b["y"][s], torch.tensor([order.index(int(d)) for d in digit[s]]))
        if task == 0:  # task 1 is the same task in every set: the same images
            assert torch.equal(b["x"][0], b["x"][2])
    for task in (0, 1):
        x, y = dm.test_set(task)
        digit, _ = trace(x)
        for s in range(3):
            assert torch.equal(y[s], torch.tensor([dm.digits[s][task].index(int(d)) for d in digit[s]]))
            assert sorted(set(digit[s].tolist())) == sorted(dm.digits[s][task])
        assert x.shape == (3, 5 * TEST_PER_DIGIT, 784)


def test_stream_is_a_sequence_of_permutations_and_switches_on_time(tiny):
    B = 5
    dm = MNISTContinual(str(tiny), shared=1, batch_size=B, epochs=[2, 1], normalise=False, seed=0)
    dm.setup("fit")
    N1 = 5 * TRAIN_PER_DIGIT
    assert dm.task_steps == [2 * N1 // B, N1 // B] and dm.switch_steps == [2 * N1 // B]
    assert [dm.task_at(s) for s in (0, 11, 12, 17)] == [0, 0, 1, 1]
    passes = []
    for p in range(2):
        ids = torch.cat([trace(dm.batch(p * N1 // B + s)["x"])[1] for s in range(N1 // B)])
        task1_images = torch.nonzero(torch.isin(dm.raw()[1], torch.tensor(dm.digits[0][0]))).flatten()
        assert sorted(ids.tolist()) == sorted(task1_images.tolist())  # every task-1 image once per pass
        passes.append(ids)
    assert not torch.equal(passes[0], passes[1])  # reshuffled between passes
    digit, _ = trace(torch.cat([dm.batch(s)["x"] for s in range(12, 18)]))
    assert set(digit.tolist()) == set(dm.digits[0][1])  # task 2: its own digits only


def test_deterministic_from_the_seed_and_resumable(tiny):
    def stream(seed: int, start: int = 0) -> list[dict]:
        dm = MNISTContinual(str(tiny), shared=[2, 4], batch_size=4, steps=[6, 6], seed=seed)
        dm.trainer = SimpleNamespace(global_step=start)  # what the loader reads when a run resumes
        return list(dm.train_dataloader())

    a, b, c = stream(0), stream(0), stream(1)
    assert len(a) == 12 and all(torch.equal(u["x"], v["x"]) and torch.equal(u["y"], v["y"]) for u, v in zip(a, b))
    assert any(not torch.equal(u["x"], v["x"]) for u, v in zip(a, c))
    resumed = stream(0, start=7)
    assert len(resumed) == 5 and all(torch.equal(u["x"], v["x"]) and int(u["step"]) == int(v["step"])
                                     for u, v in zip(a[7:], resumed))
    # a set of a multi-set run streams what a run with that k alone streams
    single = MNISTContinual(str(tiny), shared=4, batch_size=4, steps=[6, 6], seed=0)
    assert all(torch.equal(single.batch(s)["x"], a[s]["x"][1]) for s in range(12))


def test_digit_draws_repeat_every_k_with_the_digits_of_the_next_seeds(tiny):
    dm = MNISTContinual(str(tiny), shared=[1, 4], digit_draws=3, batch_size=5, steps=[4, 4], normalise=False, seed=2)
    assert dm.data_sets == 6 and dm.set_names == [f"k={k},draw={d}" for d in range(3) for k in (1, 4)]
    for d in range(3):  # draw d has the digits of a run with seed + d
        assert dm.digits[2 * d: 2 * d + 2] == MNISTContinual("unused", shared=[1, 4], seed=2 + d).digits
    assert len({tuple(dm.digits[2 * d][0]) for d in range(3)}) > 1  # the draws differ
    for step in (0, 3, 4, 7):
        b = dm.batch(step)
        digit, _ = trace(b["x"])
        task = int(b["task"])
        for g in range(6):  # every set trains its own draw's digits with their labels
            order = dm.digits[g][task]
            assert set(digit[g].tolist()) <= set(order)
            assert torch.equal(b["y"][g], torch.tensor([order.index(int(v)) for v in digit[g]]))
        if task == 0:  # task 1 is shared within a draw
            assert all(torch.equal(b["x"][2 * d], b["x"][2 * d + 1]) for d in range(3))
    x, y = dm.fisher_data(0, 6)
    for g in range(6):
        assert set(trace(x)[0][g].tolist()) <= set(dm.digits[g][0])
    with pytest.raises(ValueError, match="digit_draws"):
        MNISTContinual(str(tiny), shared=1, digit_draws=0)
    with pytest.raises(ValueError, match="digit_draws"):
        MNISTContinual(str(tiny), task_digits=[[0, 1, 2, 3, 4], [0, 1, 5, 6, 7]], digit_draws=2)


def test_fisher_data_and_test_set_shapes(tiny):
    dm = MNISTContinual(str(tiny), shared=3, batch_size=4, seed=0, num_test=7, normalise=False)
    x, y = dm.fisher_data(0, 10)
    assert x.shape == (10, 784) and y.shape == (10,)
    digit, ids = trace(x)
    assert len(set(ids.tolist())) == 10 and set(digit.tolist()) <= set(dm.digits[0][0])  # no repeats
    assert torch.equal(dm.fisher_data(0, 10)[0], x)
    assert dm.fisher_data(1, 1000)[0].shape == (5 * TRAIN_PER_DIGIT, 784)  # capped at the task's size
    assert dm.test_set(1)[0].shape == (7, 784)


def test_normalise_standardises_with_the_training_set(tiny):
    dm = MNISTContinual(str(tiny), shared=0, seed=0)
    pix = dm.raw()[0].double() / 255
    x_raw = MNISTContinual(str(tiny), shared=0, seed=0, normalise=False).batch(0)["x"].double()
    x = dm.batch(0)["x"].double()
    assert torch.allclose(x, (x_raw - pix.mean()) / pix.std(), atol=1e-5)  # float32 pixels


def test_missing_folder_is_a_clear_error(tmp_path):
    where = tmp_path / "nowhere"
    dm = MNISTContinual(str(where), shared=2)
    with pytest.raises(FileNotFoundError) as err:
        dm.setup("fit")
    msg = str(err.value)
    assert str(where / "MNIST" / "raw") in msg and "shared/data" in msg and "download=True" in msg


def test_corrupt_files_are_clear_errors(tmp_path):
    gz = tiny_mnist(tmp_path / "gz", gz=True)  # our tiny .gz files are not the originals: md5 fails
    with pytest.raises(RuntimeError, match="md5"):
        MNISTContinual(str(gz), shared=2).setup("fit")
    cut = tiny_mnist(tmp_path / "cut")
    f = cut / "MNIST" / "raw" / "train-images-idx3-ubyte"
    f.write_bytes(f.read_bytes()[:1000])  # truncated
    with pytest.raises(RuntimeError, match="could not read"):
        MNISTContinual(str(cut), shared=2).setup("fit")
    bad = tiny_mnist(tmp_path / "bad")
    img, lab = idx_bytes(np.zeros((3, 28, 28)), np.array([1, 12, 3]))  # a label outside 0..9
    (bad / "MNIST" / "raw" / "t10k-images-idx3-ubyte").write_bytes(img)
    (bad / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").write_bytes(lab)
    with pytest.raises(RuntimeError, match="do not hold MNIST"):
        MNISTContinual(str(bad), shared=2).setup("fit")


@pytest.mark.parametrize("kwargs, match", [
    ({"shared": 6}, "shared"),
    ({"shared": -1}, "shared"),
    ({"shared": [1, 7]}, "shared"),
    ({"shared": 2.5}, "shared"),
    ({}, "give shared"),
    ({"task_digits": [[0, 1, 2, 3, 4]]}, "task_digits"),
    ({"task_digits": [[0, 1, 2, 3, 3], [5, 6, 7, 8, 9]]}, "task_digits"),
    ({"task_digits": [[0, 1, 2, 3, 4], [5, 6, 7, 8, 10]]}, "task_digits"),
    ({"task_digits": [[0, 1, 2, 3, 4], [0, 6, 7, 8, 9]], "shared": 2}, "share 1"),
    ({"shared": 1, "batch_size": 0}, "batch_size"),
    ({"shared": 1, "epochs": 0}, "epochs"),
    ({"shared": 1, "epochs": [1, 2, 3]}, "epochs"),
    ({"shared": 1, "steps": [10]}, "steps"),
    ({"shared": 1, "num_test": 0}, "num_test"),
    ({"shared": 1, "first_task": [0, 1, 2, 3]}, "first_task"),
    ({"shared": 1, "first_task": [0, 1, 2, 3, 3]}, "first_task"),
    ({"shared": 1, "first_task": [0, 1, 2, 3, 10]}, "first_task"),
    ({"first_task": [0, 1, 2, 3, 4], "task_digits": [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]}, "give one"),
    ({"shared": 1, "permute_new": 1.5}, "permute_new"),
    ({"shared": 1, "permute_new": -0.1}, "permute_new"),
    ({"shared": 1, "permute_new": True}, "permute_new"),
])
def test_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MNISTContinual("unused", **kwargs)


def test_first_task_fixes_task_1_and_draws_the_rest():
    # [S] App. G: task 1 is "the first 5 classes", task 2 takes its new digits from the other five
    dm = MNISTContinual("unused", shared=[0, 1, 2, 3, 4, 5], first_task=[0, 1, 2, 3, 4], digit_draws=8)
    orders, shared_first = set(), set()
    for (a, b), k in zip(dm.digits, dm.shared):
        assert sorted(a) == [0, 1, 2, 3, 4] and len(set(b)) == 5
        assert b[:k] == a[:k] and all(d >= 5 for d in b[k:])  # k of task 1's, labels kept; new ones 5..9
        orders.add(tuple(a))
        if k == 1:
            shared_first.add(b[0])
    assert len(orders) == 8  # the draws differ in labels and in which digits are shared
    assert len(shared_first) > 1
    free = MNISTContinual("unused", shared=[0, 1, 2, 3, 4, 5], digit_draws=8)
    assert any(sorted(a) != [0, 1, 2, 3, 4] for a, _ in free.digits)  # without it task 1 is drawn


def test_explicit_task_digits(tiny):
    dm = MNISTContinual(str(tiny), task_digits=[[9, 8, 7, 6, 5], [8, 9, 0, 1, 2]], normalise=False, steps=[2, 2])
    assert dm.shared == [2] and dm.digits == [[[9, 8, 7, 6, 5], [8, 9, 0, 1, 2]]]
    x, y = dm.test_set(1)
    digit, _ = trace(x)
    assert torch.equal(y, torch.tensor([[8, 9, 0, 1, 2].index(int(d)) for d in digit]))


def test_trains_a_multi_head_classifier_with_ewc(tiny):
    # the batch format is what zoo.MultiHeadClassifier consumes, one member per data set
    from helpers_fit import fit
    from zoo.models.classifier import MultiHeadClassifier
    from zoo.training.ewc import EWC

    dm = MNISTContinual(str(tiny), shared=[0, 5], batch_size=8, steps=[5, 5], seed=0)
    net = MultiHeadClassifier(hidden=16, n_classes=5, ewc=EWC(xi=1.0, samples=20))
    trainer = fit(net, dm)
    assert trainer.global_step == 10 and net.ensemble == 2 and int(net.task) == 1
    assert float(net.ewc.fisher("W").abs().sum()) > 0  # consolidated at the switch from fisher_data
    assert net.labels == ["k=0", "k=5"]


@pytest.mark.skipif(SHARED_RAW is None, reason="the real MNIST files (../shared/data/MNIST/raw) are not here")
def test_real_mnist_from_a_copy_of_the_shared_gz_files(tmp_path, monkeypatch):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in SHARED_RAW.glob("*.gz"):
        shutil.copyfile(f, raw / f.name)  # only the .gz: their md5 is verified and they are extracted
    raw.chmod(0o555)  # read-only, as CI's shared folder (root could still write: the loader must not)
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "cache"))
    dm = MNISTContinual(str(tmp_path), shared=2, seed=0)
    dm.setup("fit")
    X, D = dm.raw(train=True)
    assert X.shape == (60000, 28, 28) and dm.raw(train=False)[0].shape == (10000, 28, 28)
    # published per-digit counts of MNIST (LeCun et al.), digits 0..9
    train_counts = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    test_counts = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert torch.bincount(D, minlength=10).tolist() == train_counts
    t1 = dm.digits[0][0]
    assert dm.train_size(0) == sum(train_counts[d] for d in t1)
    x, y = dm.test_set(0)
    assert x.shape == (sum(test_counts[d] for d in t1), 784)
    assert torch.bincount(y, minlength=5).tolist() == [test_counts[d] for d in t1]  # label i = digit t1[i]
    # the training set's pixel statistics (the usual MNIST normalisation constants)
    mean, std = dm.pixel_stats
    assert mean == pytest.approx(0.1307, abs=1e-4) and std == pytest.approx(0.3081, abs=1e-4)
    assert sorted(p.name for p in raw.iterdir()) == sorted(p.name for p in SHARED_RAW.glob("*.gz"))
    assert len(list((tmp_path / "cache" / "MNIST").glob("*/train-images-idx3-ubyte"))) == 1  # extracted there


@pytest.mark.parametrize("f", [0.5, 1.0])
def test_permute_new_shuffles_only_the_new_digits_pixels(tiny, f):
    """Against the same datamodule without permute_new (the same streams): task 1 and the kept
    digits are served unchanged, task 2's new digits as those images with permuted pixels."""
    kw = dict(data_dir=str(tiny), shared=[0, 2, 5], batch_size=8, steps=[2, 3], seed=4, num_test=12,
              digit_draws=2, normalise=False)
    dm, plain = MNISTContinual(permute_new=f, **kw), MNISTContinual(**kw)
    perm = dm.pixel_permutation
    assert sorted(perm.tolist()) == list(range(784))
    moved = int((perm != torch.arange(784)).sum())
    assert round(f * 784) - 10 <= moved <= round(f * 784)  # a shuffle leaves a few in place
    assert torch.equal(MNISTContinual(**kw).pixel_permutation, torch.arange(784))

    def expected(x, y, set_index):
        """plain's images with task 2's new digits permuted; (rows, 784)."""
        new = ~torch.isin(torch.tensor(dm.digits[set_index][1])[y], torch.tensor(dm.digits[set_index][0]))
        out = x.clone()
        out[new] = x[new][:, perm]
        return out, new

    served = []
    for step in range(5):
        b, p = dm.batch(step), plain.batch(step)
        assert torch.equal(b["y"], p["y"])
        for s in range(dm.data_sets):
            if step < 2:
                assert torch.equal(b["x"][s], p["x"][s])  # task 1 is never permuted
            else:
                want, new = expected(p["x"][s], p["y"][s], s)
                assert torch.equal(b["x"][s], want)
                served.append((dm.shared[s], bool(new.any())))
    for getter in (lambda m: m.test_set(1), lambda m: m.fisher_data(1, 20)):
        (x, y), (xp, yp) = getter(dm), getter(plain)
        assert torch.equal(y, yp)
        for s in range(dm.data_sets):
            assert torch.equal(x[s], expected(xp[s], yp[s], s)[0])
    assert torch.equal(dm.test_set(0)[0], plain.test_set(0)[0])
    # k = 5 keeps every digit, so nothing is permuted; k < 5 has new digits, which were
    assert not any(new for k, new in served if k == 5) and all(new for k, new in served if k == 0)
