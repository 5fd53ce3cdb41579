"""Exact resume of the GDLN family ([H] recipes: Comparison of ReLUNet / GDLN, DepthGDLN, ReLN
discovery) and of DeepLinearNet's NTK recipe and minibatch regression (a Comparison of two GDLNs on XoR, fig2,
and the phase diagram, were checked too and dropped from the suite for time: they exercise nothing
the cases here do not): stopped by max_steps, or killed
with SIGKILL after a mid-run checkpoint, then resumed with --ckpt_path last: the same final
weights, scalars and figures as the uninterrupted run, bit for bit.

The recipes run with small overrides (few epochs per step, small ensembles) so each run takes a
second or two; global_step counts epochs (full-batch GD updates) for the GDLN family.
"""
from __future__ import annotations


import pytest
from resume_harness import REPO, assert_same_run, checkpoint_step, fit, fit_killed

pytestmark = pytest.mark.slow  # runs of recipes through the CLI (several seconds each)

R = f"{REPO}/recipes"
EPS = "--model.init_args.epochs_per_step=10"
# fig6's networks at a tenth of their width, 4 runs each (the recipe: 100 runs, minutes)
FIG6_SMALL = """[
  {class_path: zoo.models.gdln.ReLUNet, init_args: {hidden: [12, 12], init: {class_path: zoo.init.Gaussian,
   init_args: {sigma: 0.003}}, ensemble: 4, lr: 0.001, reduction: sum}},
  {class_path: zoo.models.gdln_depth.DepthGDLN, init_args: {gating: reln, n_shared: 12, n_hidden: 3,
   init: {class_path: zoo.init.Gaussian, init_args: {sigma: 0.003}}, ensemble: 4, lr: 0.001, reduction: sum}}]"""
CASES = {
    # Comparison of four networks on contexts: LossCurves (race), PathwaySingularValues
    # (100 epochs: LossCurves' points at 50 and 100 come after every interruption)
    "fig4": ["--config", f"{R}/haste_slowly/fig4_contexts.yaml", "--trainer.max_steps=100", EPS],
    # two-layer ReLUNet + DepthGDLN: StereotypicalLoss, LossCurves, ActivationPatterns per layer
    "fig6": ["--config", f"{R}/haste_slowly/fig6_depth.yaml", "--trainer.max_steps=2000",
             "--model.init_args.epochs_per_step=100", "--model.init_args.models", FIG6_SMALL],
    # ReLUNet: ActivationPatterns (trains a GDLN per k at the end), HiddenMDS
    "fig8": ["--config", f"{R}/haste_slowly/fig8_9_reln_discovery.yaml", "--trainer.max_steps=200", EPS],
    # a GDLN on its own (no recipe trains one alone): the residual scheme, race and pathway modes
    "gdln": ["--model=zoo.models.gdln.GDLN", "--model.init_args.gating=reln", "--model.init_args.n_hidden=20",
             "--model.init_args.training=residual", "--model.init_args.epochs_per_step=10",
             '--model.init_args.init={"class_path": "zoo.init.Gaussian", "init_args": {"sigma": 0.001}}',
             "--data=datamodules.contexts.Contexts", "--trainer.max_steps=200", "--trainer.max_epochs=-1",
             "--trainer.callbacks+=callbacks.gdln.LossCurves", "--trainer.callbacks+=callbacks.gdln.PathwaySingularValues"],
    # shuffled minibatches of a regression task over an epoch budget: the stop falls mid-epoch
    "minibatch": ["--config", f"{R}/quickstart.yaml", "--trainer.max_steps=-1", "--trainer.max_epochs=3",
                  "--data.init_args.batch_size=3"],
    # DeepLinearNet: the NTK at initialisation must survive the resume
    "ntk": ["--config", f"{R}/lazy_rich/ntk_square.yaml", "--trainer.max_steps=400"],
}
STOP = {"fig4": 40, "fig6": 700, "fig8": 70, "gdln": 70, "minibatch": 40, "ntk": 150}
TOTAL = {"fig4": 100, "fig6": 2000, "fig8": 200, "gdln": 200, "minibatch": 90, "ntk": 400}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Each case's uninterrupted run, made once for both tests."""
    cache: dict = {}

    def get(case):
        if case not in cache:
            cache[case] = fit(tmp_path_factory.mktemp(f"full_{case}"), *CASES[case])
        return cache[case]

    return get


# a few cases run by default (under ~40 s together); every case runs with -m slow
FAST_STOP = {"fig6", "fig8", "ntk", "minibatch"}
# the kill (SIGKILL of a subprocess) checks what a max_steps stop does not: the purge of points logged
# after the checkpoint and the loggers' flush, which are the same for every case (the "gdln" case was
# killed too when this was written, and passed)
KILL = ("fig4",)


def _cases(fast: set[str]) -> list:
    return [c if c in fast else pytest.param(c, marks=pytest.mark.slow) for c in CASES]


@pytest.mark.parametrize("case", _cases(FAST_STOP))
def test_stop_by_max_steps_then_resume(case, references, tmp_path):
    full = references(case)
    args = CASES[case]
    fit(tmp_path, *args, f"--trainer.max_steps={STOP[case]}")
    ckpt = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert checkpoint_step(ckpt) == STOP[case]
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert not (tmp_path / "lightning_logs/version_1").exists()
    assert checkpoint_step(ckpt) == TOTAL[case]
    assert_same_run(full, run, stop_step=STOP[case])


@pytest.mark.parametrize("case", KILL)
def test_kill_then_resume(case, references, tmp_path):
    # the subprocess runs on this process's thread count (conftest: one), as the reference did
    full = references(case)
    args = CASES[case]
    step = fit_killed(tmp_path, *args)
    assert 0 < step < TOTAL[case]
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert_same_run(full, run)


def test_epoch_shuffle_is_a_function_of_seed_and_epoch_and_skips_once():
    from datamodules.regression import EpochShuffle

    a, b = EpochShuffle(10, seed=3), EpochShuffle(10, seed=3)
    b.set_epoch(1)
    first, second = list(a), list(b)
    assert sorted(first) == list(range(10)) and first != second
    a.set_epoch(1)
    assert list(a) == second  # epoch 1's order without drawing epoch 0's
    a.skip = 4
    assert list(a) == second[4:] and list(a) == second  # the skip applies to one pass
