"""Tensor parallelism: how a model's layers are cut over the ranks (sharding), the group of ranks and rank 0's side
of it (ranks: start the other processes, relay steps, gather their spans), and the wire format of a step."""
