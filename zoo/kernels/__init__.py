"""The fast exact update paths the models run (plain torch, no Lightning): each computes the same
arithmetic as its model's generic autograd step, many members at once.

Layer: imported by ``zoo.models``; imports only torch and ``zoo.utils``.
"""
