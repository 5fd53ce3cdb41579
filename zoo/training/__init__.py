"""Training machinery shared by every model: update counting, logging, checkpoints, the
member-parallel strategy, the divergence stop, progress, ensembles of initialisations.

Layer: imported by ``zoo.models`` (and above); imports the pure layers only.
"""
