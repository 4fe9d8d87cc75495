"""Data parallel for `pipeline(..., data_parallel=N)` in a script the launcher starts on every rank.

Every rank runs the same script and calls the pipeline with the same prompts; each answers its
in-order share with its own replica of a single-rank export, and every rank gets all the answers
in input order (rank 0 gathers them over the rank channel and sends them back).
"""
from __future__ import annotations

import os
from typing import Callable, List

from lite_runtime.contract.errors import ConfigError
from lite_runtime.distributed.rank_channel import RankChannel


def split_in_order(items: list, groups: int) -> List[list]:
    """Consecutive shares of `items`, the first ones one longer when they do not divide evenly."""
    size, extra = divmod(len(items), groups)
    bounds = [0]
    for g in range(groups):
        bounds.append(bounds[-1] + size + (1 if g < extra else 0))
    return [items[bounds[g]:bounds[g + 1]] for g in range(groups)]


class DataParallelGroup:
    def __init__(self, data_parallel: int, export_ranks: int, where: str):
        size = os.environ.get("RANK_SIZE")
        if size is None or size.strip() != str(data_parallel):
            raise ConfigError(f"data_parallel {data_parallel} needs a script started on {data_parallel} ranks by the "
                              "launcher (python -m lite_runtime.distributed.launch --rank_table FILE -- script.py); "
                              + ("RANK_SIZE is not set" if size is None else f"this run has RANK_SIZE {size!r}"))
        if export_ranks > 1:
            raise ConfigError(f"data_parallel {data_parallel} with {where}, an export of {export_ranks} ranks: data "
                              "parallel runs replicas of a single-rank export; export with model_parallel 1")
        self.channel = RankChannel.from_env()
        self.rank, self.size = self.channel.rank, data_parallel

    def run(self, items: list, answer: Callable[[list], list]) -> list:
        """`answer` of this rank's share of `items`; every rank returns the answers to all, in order."""
        share = split_in_order(list(items), self.size)[self.rank]
        mine = answer(share) if share else []
        if self.rank == 0:
            for rank in range(1, self.size):
                mine = mine + self.channel.recv_json_from(rank)
            self.channel.send_json(mine)
            return mine
        self.channel.reply_json(mine)
        return self.channel.recv_json()

    def close(self) -> None:
        self.channel.close()
