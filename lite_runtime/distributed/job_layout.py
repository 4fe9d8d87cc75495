"""Which engine, channel and port each rank of a launched job uses.

A job of dp·mp ranks runs dp replicas of an mp-rank export; consecutive ranks form a replica
(ranks r·mp … r·mp+mp−1; data_parallel.ReplicaLayout). Each replica has its own engine: a MindSpore
cluster on `ms` (its own scheduler and port: one cluster has one world group) or an MPI join on Lite
segments (its own rank channel publishing the MPI port). Every rank talks to rank 0 over the job's
channel (mirrored.py). Every listener sits on the address of the server that holds the
replica's (or the job's) first rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from lite_runtime.distributed.data_parallel import LAYOUT_ENV, ReplicaLayout
from lite_runtime.distributed.host_collectives import MPI_CHANNEL_ENV
from lite_runtime.distributed.process_group import free_port, ms_cluster_env
from lite_runtime.distributed.rank_channel import CHANNEL_ENV


@dataclass
class JobLayout:
    data_parallel: int
    model_ranks: int
    hosts: Sequence[str]        # per rank: the address its listeners use (its server's)
    ms_cluster: bool            # backend ms with a multi-rank export: a MindSpore cluster per replica
    mpi: bool                   # Lite segments: an MPI join per replica
    master_port: Optional[int] = None    # None: free ports of this machine (every rank is here)
    linked: bool = False                 # several servers: their launchers keep in touch (servers.py)

    def __post_init__(self):
        names = [f"scheduler{r}" for r in range(self.data_parallel) if self.ms_cluster] + ["channel"]
        names += ["launchers"] if self.linked else []
        names += [f"mpi{r}" for r in range(self.data_parallel) if self.mpi]
        # With a master port every launcher of the job derives the same ports: the first replica's
        # scheduler gets master_port itself (as msrun's), the others follow in this fixed order.
        self.ports: Dict[str, int] = {n: (self.master_port + i if self.master_port is not None else free_port())
                                      for i, n in enumerate(names)}

    @property
    def world(self) -> int:
        return len(self.hosts)

    def address(self, name: str, rank: int = 0):
        """(host, port) of listener `name`, on the server of `rank`."""
        return self.hosts[rank], self.ports[name]

    def _at(self, rank: int, name: str) -> str:
        return f"{self.hosts[rank]}:{self.ports[name]}"

    def env(self, rank: int) -> Dict[str, str]:
        where = ReplicaLayout(rank, self.data_parallel, self.model_ranks)
        values = {"RANK_ID": str(rank), "RANK_SIZE": str(self.world), CHANNEL_ENV: self._at(0, "channel"),
                  LAYOUT_ENV: str(self.data_parallel)}
        if self.mpi:
            values[MPI_CHANNEL_ENV] = self._at(where.first_rank(where.replica), f"mpi{where.replica}")
        if self.ms_cluster:
            values.update(self._cluster(where.replica), MS_ROLE="MS_WORKER", MS_NODE_ID=str(where.model_rank))
        return values

    def _cluster(self, replica: int) -> Dict[str, str]:
        first = ReplicaLayout(0, self.data_parallel, self.model_ranks).first_rank(replica)
        return ms_cluster_env(self.hosts[first], self.ports[f"scheduler{replica}"], self.model_ranks)

    def schedulers(self, ranks: Sequence[int]) -> List[Dict[str, str]]:
        """The clusters whose scheduler runs with `ranks`: those of the replicas whose first rank is there."""
        if not self.ms_cluster:
            return []
        layout = ReplicaLayout(0, self.data_parallel, self.model_ranks)
        return [self._cluster(r) for r in range(self.data_parallel) if layout.first_rank(r) in ranks]
