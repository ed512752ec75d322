"""The federated-learning core: which tensors stay local, strategies, one round, SCAFFOLD, DP.

Pure algorithms on tensors: nothing here imports a task, an engine or a tracker.
"""
