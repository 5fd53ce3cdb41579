"""Small helpers every layer may use: thread counts for a call, optional dependencies, member labels.

Layer: the bottom; imports no other part of the zoo.
"""
