"""Figure builders: each returns a matplotlib ``Figure`` (nothing is written or shown), so the
same figure serves a notebook and a callback (``zoo.training.logs.log_figure`` logs it to
TensorBoard and writes it once as a PNG)."""
from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend unless the user chose another (e.g. in a notebook)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt
