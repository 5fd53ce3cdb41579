"""The model families, one LightningModule per file, each on :class:`zoo.models.base.ZooModule`.

Layer: imported by ``callbacks``, ``datamodules`` and ``zoo.cli``; imports ``zoo.training``,
``zoo.kernels`` and the pure layers (``zoo.theory``, ``zoo.metrics``, ``zoo.init``, ``zoo.utils``).
"""
