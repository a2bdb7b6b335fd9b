"""Decentralised data-parallel training (``--mode gossip`` and its baseline ``--mode allreduce``).

After *Efficient Asynchronous GCN Training on a GPU Cluster* (ICPADS 2021): Cluster-GCN batches
(``batches``) from a shared work pool, gradients averaged with a random partner instead of all-reduce
(``worker``), one coordinator that hands out batches, forms pairs and ends epochs (``coordinator``),
and the launcher for a laptop or ``torchrun`` (``launcher``). See docs/gossip.md.
"""
