"""A launched job's layout, and its ranks' parts in a script that runs on every rank (`pipeline(...,
data_parallel=N)`, `run_infer_main.py --distributed True`).

A job of dp·mp ranks runs dp replicas of an mp-rank export; consecutive ranks form a replica
(replica r is ranks r·mp … r·mp+mp−1, as MindSpore's and upstream's layouts have it), and each
replica joins its own engine (a MindSpore cluster, or an MPI join). Every rank talks to rank 0 over
the job's channel ($LITE_CHANNEL), by the mirrored protocol (mirrored.py): rank 0 answers each
request, splitting its prompts in order over the replicas, and the other ranks replay its calls.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional

from lite_runtime.contract.errors import ConfigError, DistributedError
from lite_runtime.distributed.mirrored import follow, replica_sessions
from lite_runtime.distributed.rank_channel import CHANNEL_ENV, RankChannel, parse_address

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
            hint = f" (data_parallel {size // model_ranks} fits it)" if size % model_ranks == 0 else ""
            raise ConfigError(f"data_parallel {data_parallel} with an export of {model_ranks} rank(s) needs "
                              f"{data_parallel * model_ranks} ranks; this job has RANK_SIZE {size}{hint}")
        laid_out = os.environ.get(LAYOUT_ENV, "1")
        if model_ranks > 1 and laid_out != str(data_parallel):
            raise ConfigError(f"data_parallel {data_parallel} with an export of {model_ranks} ranks: the launcher laid "
                              f"the job out for data_parallel {laid_out}; give `--data_parallel {data_parallel}` among "
                              "the script's arguments so that it starts one engine per replica")
        return cls(rank, data_parallel, model_ranks)

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.model_ranks

    def first_rank(self, replica: int) -> int:
        return replica * self.model_ranks

    def channel(self) -> RankChannel:
        """This rank's end of the job's channel (rank 0 listens, every other rank connects)."""
        if CHANNEL_ENV not in os.environ:
            raise DistributedError(f"${CHANNEL_ENV} is not set: run under the launcher "
                                   "(python -m lite_runtime.cli.launch --rank_table FILE -- ...)")
        return RankChannel(self.rank, self.world_size, parse_address(os.environ[CHANNEL_ENV], CHANNEL_ENV))


def launched_ranks(data_parallel: int, export_ranks: int, where: str) -> Optional["LaunchedRanks"]:
    """This rank's part in a script the launcher started on several ranks; None for a process that runs
    alone (the launcher's one-rank jobs included)."""
    size = os.environ.get("RANK_SIZE")
    wanted = data_parallel * export_ranks
    if data_parallel > 1 and (size is None or size.strip() != str(wanted)):
        raise ConfigError(f"data_parallel {data_parallel} with {where} ({export_ranks} rank(s) per replica) needs a "
                          f"script started on {wanted} ranks by the launcher (python -m "
                          "lite_runtime.cli.launch --rank_table FILE -- script.py); "
                          + ("RANK_SIZE is not set" if size is None else f"this run has RANK_SIZE {size!r}"))
    if size is None or size.strip() == "1":
        return None
    return LaunchedRanks(ReplicaLayout.from_env(data_parallel, export_ranks))


class LaunchedRanks:
    """Rank 0 answers each request on a session per replica (`sessions`); every other rank replays the
    calls rank 0 sends it (`follow`) and gets the answers."""

    def __init__(self, layout: ReplicaLayout):
        self.layout = layout
        self.channel = layout.channel()
        self.leads = layout.rank == 0
        self._others = range(1, layout.world_size)
        self.calls = 0          # calls replayed (a rank other than 0)

    def sessions(self, session) -> list:
        """Rank 0: a session per replica, its own first (mirrored.replica_sessions)."""
        return replica_sessions(session, self.channel, self.layout.model_ranks)

    def shares(self, items: list) -> List[list]:
        return split_in_order(list(items), self.layout.data_parallel)

    def answered(self, answers) -> None:
        """Rank 0: the request's answers, for the scripts of the other ranks."""
        self.channel.send_json_to(self._others, {"answers": answers})

    def failed(self, error: BaseException) -> None:
        """Rank 0: tell the other ranks the request failed (as far as they can be reached: a lost rank
        must not hide `error`, which the caller raises)."""
        try:
            self.channel.send_json_to(self._others, {"error": f"{type(error).__name__}: {error}"})
        except DistributedError:
            pass

    def follow(self, session) -> dict:
        """Another rank: replay rank 0's calls until the request ends; returns the message that ends it."""
        calls, message = follow(session, self.channel, reply=self.layout.model_rank == 0)
        self.calls += calls
        return message

    def close(self) -> None:
        self.channel.close()
