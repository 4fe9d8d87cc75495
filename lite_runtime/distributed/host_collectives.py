"""Collectives on the host between the segments of a rank (MindSpore Lite on CPU has none): MPI
through `mpi4py` and the MPICH wheel.

The launcher starts every rank as its own one-process MPI job (`mpiexec -n 1`, which gives each a
distinct MPI identity) and gives each replica's ranks the address of a rank channel in
`LITE_MPI_CHANNEL`; the replica's rank 0 opens an MPI port and sends its name over that channel (so
it reaches ranks on other servers without a shared filesystem), the other ranks connect to it, and
the joined communicator is ordered by rank.
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import Sequence, Tuple

import numpy as np

from lite_runtime.contract.errors import DistributedError, UnsupportedError
from lite_runtime.distributed.rank_channel import RankChannel, parse_address

MPI_CHANNEL_ENV = "LITE_MPI_CHANNEL"


def mpiexec() -> str:
    """MPICH's `mpiexec` beside this Python (the wheel's), else on PATH."""
    found = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if not found:
        raise UnsupportedError("the segment form of a multi-rank export needs MPI (the mpich and mpi4py packages): "
                               "`mpiexec` is not installed; run `make setup`")
    return found


class HostCollectives:
    def __init__(self, rank: int, world_size: int, address: Tuple[str, int], names: Sequence[int],
                 timeout: float = 120.0):
        try:
            from mpi4py import MPI
        except ImportError:
            raise UnsupportedError("the segment form of a multi-rank export needs mpi4py (and the mpich wheel); "
                                   "run `make setup`") from None
        self.rank, self.world_size = rank, world_size
        comm = MPI.COMM_SELF
        channel = RankChannel(rank, world_size, address, timeout, names)
        # Each newcomer joins everyone who is in already, one at a time: rank 0 gives the port to the next only
        # once the last has joined (with two connecting to it at once MPICH's Accept crashed, SIGSEGV, at 3 ranks).
        try:
            if rank == 0:
                port = MPI.Open_port()
                for newcomer in range(1, world_size):
                    channel.send_json_to(newcomer, {"mpi_port": port})
                    comm = comm.Accept(port).Merge(high=False)
                MPI.Close_port(port)
            else:
                port = channel.recv_json()["mpi_port"]
                comm = comm.Connect(port).Merge(high=True)
                while comm.Get_size() < world_size:
                    comm = comm.Accept(port).Merge(high=False)
        finally:
            channel.close()
        self.comm = comm.Split(0, rank)          # ranks in RANK_ID order, whoever connected first
        if self.comm.Get_rank() != rank:
            raise DistributedError(f"rank {rank}: MPI placed this process at rank {self.comm.Get_rank()}")

    def all_reduce(self, part: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out = the sum of every rank's `part`."""
        self.comm.Allreduce(part, out)
        return out

    def all_gather_last(self, part: np.ndarray, gathered: np.ndarray, out: np.ndarray) -> np.ndarray:
        """(B, V/N) on each rank -> `out` (B, V), rank r's part at columns r·V/N ...; `gathered`
        (N, B, V/N) is the receive buffer."""
        self.comm.Allgather(part, gathered)
        np.copyto(out.reshape(part.shape[0], len(gathered), -1), np.moveaxis(gathered, 0, 1))
        return out

    def close(self) -> None:
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None:
            comm.Free()


class OneRank:
    """The collectives of a one-rank segment export: every rank's sum and gather is this rank's own part."""

    def all_reduce(self, part: np.ndarray, out: np.ndarray) -> np.ndarray:
        return part

    def all_gather_last(self, part: np.ndarray, gathered: np.ndarray, out: np.ndarray) -> np.ndarray:
        return part

    def close(self) -> None:
        pass


def from_env(rank: int, world_size: int):
    """The host collectives of rank `rank` of an export, in a replica started by the launcher (none
    for a one-rank export); a clear error otherwise."""
    if world_size == 1:
        return OneRank()
    address = os.environ.get(MPI_CHANNEL_ENV)
    if not address:
        raise UnsupportedError(f"this export has {world_size} ranks of step segments (parallel.collectives: host): "
                               "run it with the launcher, `python -m lite_runtime.cli.launch --rank_table "
                               "FILE -- run_infer_main.py ...`, which starts every rank")
    first = int(os.environ.get("RANK_ID", rank)) - rank     # the job rank of the replica's rank 0, for messages
    return HostCollectives(rank, world_size, parse_address(address, MPI_CHANNEL_ENV),
                           range(first, first + world_size))

