"""Statistics and profile-shape tests on logged results: pure functions on tensors and arrays
(no Lightning, no plotting), usable from a notebook on a run's numbers."""
