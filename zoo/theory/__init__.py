"""Closed forms and ODEs of the papers: pure torch, no Lightning (usable from a notebook)."""
