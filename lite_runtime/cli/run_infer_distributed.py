"""`run_infer_main.py --distributed True`: one rank of a launched multi-rank run.

Only rank 0 reads prompts and prints. Tensor parallel: the replica's first rank runs each request as
a one-rank run would, and the replica's other ranks replay its session calls on their parts of the
model (the mirrored protocol, mirrored.py), so only one rank chooses tokens. Data parallel
(`--data_parallel N`, N replicas of the export; data_parallel.py): rank 0 splits each request's
prompts in order over the replicas and prints the answers in input order; each replica's first rank
answers its share the same way.
"""
from __future__ import annotations

import logging
import sys

import numpy as np

from lite_runtime.api.generation_options import GenerationOptions
from lite_runtime.distributed.data_parallel import ReplicaLayout, split_in_order
from lite_runtime.distributed.mirrored import MirroredSession, follow
from lite_runtime.distributed.rank_channel import RankChannel

log = logging.getLogger("lite_runtime.distributed")


def _mirror(replica, made: list = None):
    """The wrapper of a replica's first rank's session (None without other ranks in the replica);
    the sessions it makes are added to `made`."""
    if replica is None:
        return None

    def wrap(session):
        mirrored = MirroredSession(session, replica, range(1, replica.world_size))
        if made is not None:
            made.append(mirrored)
        return mirrored
    return wrap


def run_distributed(args, run, make_generator, generation_options) -> None:
    """This rank's part of a launched run_infer_main; the single-process CLI's `run`, `make_generator`
    and `generation_options` do the work (given by the command, which imports this module)."""
    layout = ReplicaLayout.from_env(args.data_parallel)
    if args.backend == "ms" and layout.model_ranks > 1:
        from lite_runtime.backends.ms_backend import join_cluster
        join_cluster()   # before any graph with collectives is loaded: one without a group crashes the process
    replicas = layout.replicas_channel()
    replica = layout.replica_channel()
    try:
        if layout.model_rank > 0:
            _follow(args, replica, make_generator)
        elif layout.rank == 0:
            _lead(args, replicas, replica, run, generation_options)
        else:
            _serve(args, replicas, replica, make_generator)
    finally:
        for channel in (replicas, replica):
            if channel is not None:
                channel.close()


def _lead(args, replicas, replica, run, generation_options) -> None:
    """Rank 0: the normal run, its session mirrored to its replica's other ranks. With replicas, each
    request's prompts are split in order over them; rank 0 answers replica 0's share, gathers the
    others' answers and prints all in order."""
    if args.do_sample and args.seed is None:
        args.seed = int(np.random.SeedSequence().entropy % (2 ** 31))   # one seed for every replica
    options = generation_options(args).to_json()      # the request's options, as every replica receives them

    def distribute(prompts, local):
        shares = split_in_order(list(prompts), replicas.world_size)
        for r in range(1, replicas.world_size):
            replicas.send_json_to(r, {"prompts": shares[r], "options": options})
        results = local(shares[0]) if shares[0] else []
        for r in range(1, replicas.world_size):
            results += replicas.recv_json_from(r)["results"]
        return results

    made = []
    try:
        run(args, wrap_session=_mirror(replica, made), distribute=distribute if replicas is not None else None)
    finally:
        if replicas is not None:
            replicas.send_json({"stop": True})
        if replica is not None and not made:     # failed before its session was made: the ranks still wait
            replica.send_json({"stop": True})


def _serve(args, replicas, replica, make_generator) -> None:
    """The first rank of replica r > 0: answer the share of each request rank 0 sends, its session
    mirrored to its replica's other ranks."""
    generator = make_generator(args, 0)
    if replica is not None:
        generator.session = _mirror(replica)(generator.session)
    try:
        while True:
            message = replicas.recv_json()
            if message.get("stop"):
                return
            prompts = message["prompts"]
            results = []
            if prompts:
                results = generator.infer(prompts, options=GenerationOptions.from_json(message["options"]))
            replicas.reply_json({"results": results})
    finally:
        generator.close()        # a mirrored session tells its ranks to stop


def _follow(args, channel: RankChannel, make_generator) -> None:
    """Other ranks of a replica: replay the calls of the replica's first rank until it stops."""
    generator = make_generator(args, channel.rank)
    try:
        calls = follow(generator.session, channel, reply=False)
        print(f"rank {channel.names[channel.rank]}: replayed {calls} calls of rank {channel.names[0]}",
              file=sys.stderr, flush=True)
    finally:
        generator.close()
