"""Decentralised data-parallel training (``--mode gossip`` and its baseline ``--mode allreduce``).

After *Efficient Asynchronous GCN Training on a GPU Cluster* (ICPADS 2021) and AD-PSGD: Cluster-GCN
batches (``batches``) from a work pool split among the workers, who steal from each other's tails
(``pool``); parameters averaged with a random peer that answers from its receive thread (``worker``,
``node``, ``peers``); no coordinator and no epoch barrier; the lowest live rank records the run
(``ledger``, ``recorder``); the launcher for a laptop or ``torchrun`` (``launcher``). See docs/gossip.md.
"""
