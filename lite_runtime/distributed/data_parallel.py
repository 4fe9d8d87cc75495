"""Data parallel: replicas of an export over the ranks of a launched job, and
`pipeline(..., data_parallel=N)` in a script the launcher starts on every rank.

A job of dp·mp ranks runs dp replicas of an mp-rank export; consecutive ranks form a replica
(replica r is ranks r·mp … r·mp+mp−1, as MindSpore's and upstream's layouts have it), and each
replica joins its own engine (a MindSpore cluster, or an MPI join). Channels (rank_channel.py): the
replicas' first ranks talk to rank 0 over the job's channel ($LITE_CHANNEL); the ranks of a replica
share requests and tokens over the replica's ($LITE_REPLICA_CHANNEL) when dp > 1 and mp > 1, else
over the job's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, List, Optional

from lite_runtime.contract.errors import ConfigError, DistributedError
from lite_runtime.distributed.rank_channel import CHANNEL_ENV, RankChannel, parse_address

REPLICA_CHANNEL_ENV = "LITE_REPLICA_CHANNEL"
LAYOUT_ENV = "LITE_DATA_PARALLEL"     # the data parallel the launcher laid the ranks out for


def split_in_order(items: list, groups: int) -> List[list]:
    """Consecutive shares of `items`, the first ones one longer when they do not divide evenly."""
    size, extra = divmod(len(items), groups)
    bounds = [0]
    for g in range(groups):
        bounds.append(bounds[-1] + size + (1 if g < extra else 0))
    return [items[bounds[g]:bounds[g + 1]] for g in range(groups)]


@dataclass(frozen=True)
class ReplicaLayout:
    """Where this process sits in a launched job of `data_parallel` replicas of `model_ranks` ranks."""
    rank: int                 # RANK_ID: the job's rank
    data_parallel: int
    model_ranks: int

    @property
    def replica(self) -> int:
        return self.rank // self.model_ranks

    @property
    def model_rank(self) -> int:
        """This process's rank of the export (its rank in its replica)."""
        return self.rank % self.model_ranks

    @classmethod
    def from_env(cls, data_parallel: int, model_ranks: Optional[int] = None) -> "ReplicaLayout":
        """`model_ranks` None: RANK_SIZE / data_parallel (the launcher checked the export)."""
        try:
            rank, size = int(os.environ["RANK_ID"]), int(os.environ["RANK_SIZE"])
        except (KeyError, ValueError):
            raise DistributedError("run under the launcher (python -m lite_runtime.cli.launch --rank_table "
                                   "FILE -- ...): RANK_ID and RANK_SIZE are not set") from None
        if model_ranks is None:
            model_ranks = max(size // data_parallel, 1)
        if size != data_parallel * model_ranks:
            raise ConfigError(f"data_parallel {data_parallel} with an export of {model_ranks} rank(s) needs "
                              f"{data_parallel * model_ranks} ranks; this job has RANK_SIZE {size}")
        laid_out = os.environ.get(LAYOUT_ENV, "1")
        if model_ranks > 1 and laid_out != str(data_parallel):
            raise ConfigError(f"data_parallel {data_parallel} with an export of {model_ranks} ranks: the launcher laid "
                              f"the job out for data_parallel {laid_out}; give `--data_parallel {data_parallel}` among "
                              "the script's arguments so that it starts one engine per replica")
        return cls(rank, data_parallel, model_ranks)

    def replicas_channel(self) -> Optional[RankChannel]:
        """First rank of each replica <-> rank 0 (None on other ranks, or with one replica)."""
        if self.data_parallel == 1 or self.model_rank != 0:
            return None
        names = [r * self.model_ranks for r in range(self.data_parallel)]
        return RankChannel(self.replica, self.data_parallel, _address(CHANNEL_ENV), names=names)

    def replica_channel(self) -> Optional[RankChannel]:
        """The ranks of this replica, its first rank leading (None for a single-rank export)."""
        if self.model_ranks == 1:
            return None
        if self.data_parallel == 1:
            return RankChannel(self.rank, self.model_ranks, _address(CHANNEL_ENV))
        first = self.rank - self.model_rank
        return RankChannel(self.model_rank, self.model_ranks, _address(REPLICA_CHANNEL_ENV),
                           names=range(first, first + self.model_ranks))


def _address(variable: str):
    if variable not in os.environ:
        raise DistributedError(f"${variable} is not set: run under the launcher "
                               "(python -m lite_runtime.cli.launch --rank_table FILE -- ...)")
    return parse_address(os.environ[variable], variable)


class DataParallelGroup:
    """Every rank calls `run` with the same items; each replica answers its in-order share, and every
    rank gets all the answers in input order (rank 0 gathers them from the replicas' first ranks,
    which check that their replica's other ranks answered alike)."""

    def __init__(self, data_parallel: int, export_ranks: int, where: str):
        size = os.environ.get("RANK_SIZE")
        wanted = data_parallel * export_ranks
        if size is None or size.strip() != str(wanted):
            raise ConfigError(f"data_parallel {data_parallel} with {where} ({export_ranks} rank(s) per replica) needs a "
                              f"script started on {wanted} ranks by the launcher (python -m "
                              "lite_runtime.cli.launch --rank_table FILE -- script.py); "
                              + ("RANK_SIZE is not set" if size is None else f"this run has RANK_SIZE {size!r}"))
        self.layout = ReplicaLayout.from_env(data_parallel, export_ranks)
        self.replicas = self.layout.replicas_channel()
        self.replica = self.layout.replica_channel()

    @property
    def model_rank(self) -> int:
        return self.layout.model_rank

    def run(self, items: list, answer: Callable[[list], list]) -> list:
        """`answer` of this replica's share of `items`; every rank returns the answers to all, in order."""
        share = split_in_order(list(items), self.layout.data_parallel)[self.layout.replica]
        mine = answer(share) if share else []
        if self.replica is not None and self.replica.rank > 0:
            self.replica.reply_json(mine)
            return self.replica.recv_json()
        if self.replica is not None:
            for rank in range(1, self.replica.world_size):
                theirs = self.replica.recv_json_from(rank)
                if theirs != mine:
                    raise DistributedError(f"rank {self.replica.names[rank]} answered {theirs!r} but rank "
                                           f"{self.layout.rank} of its replica answered {mine!r}: the ranks diverged")
        if self.replicas is not None:
            if self.replicas.rank == 0:
                for replica in range(1, self.replicas.world_size):
                    mine = mine + self.replicas.recv_json_from(replica)
                self.replicas.send_json(mine)
            else:
                self.replicas.reply_json(mine)
                mine = self.replicas.recv_json()
        if self.replica is not None:
            self.replica.send_json(mine)
        return mine

    def close(self) -> None:
        for channel in (self.replicas, self.replica):
            if channel is not None:
                channel.close()
