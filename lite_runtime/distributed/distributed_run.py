"""`run_infer_main.py --distributed True`: one rank of a launched multi-rank run.

Only rank 0 reads prompts and prints. Tensor parallel: every rank of a replica runs the same request
with the same seed; the replica's first rank sends its tokens to the others each step, and each
other rank checks that its own choice agrees, stopping with an error on divergence instead of
silently drifting. Data parallel (`--data_parallel N`, N replicas of the export; data_parallel.py):
rank 0 splits each request's prompts in order over the replicas and prints the answers in input
order; each replica's first rank leads its replica's ranks through its share.
"""
from __future__ import annotations

import logging
import sys

import numpy as np

from lite_runtime.api.generation_options import GenerationOptions
from lite_runtime.contract.errors import DistributedError
from lite_runtime.distributed.data_parallel import ReplicaLayout, split_in_order
from lite_runtime.distributed.rank_channel import RankChannel

log = logging.getLogger("lite_runtime.distributed")


class TokenAgreement:
    """Wraps a rank's sampler: rank 0 of the channel broadcasts its tokens; other ranks compare theirs."""

    def __init__(self, channel: RankChannel):
        self.channel = channel
        self.step = 0

    def wrap(self, sampler):
        def pick(logits, ids, lengths, prompt_lengths=None):
            mine = sampler(logits, ids, lengths, prompt_lengths)
            if self.channel.rank == 0:
                self.channel.send_tokens(mine)
                return mine
            theirs = self.channel.recv_tokens()
            if not np.array_equal(mine, theirs):
                raise DistributedError(f"rank {self.channel.names[self.channel.rank]} chose tokens {mine.tolist()} but "
                                       f"rank {self.channel.names[0]} chose {theirs.tolist()} at step {self.step}: "
                                       "the ranks diverged")
            self.step += 1
            return theirs
        return pick


def run_distributed(args, run, make_generator, generation_options) -> None:
    """`run`, `make_generator` and `generation_options` are the single-process CLI's (cli/run_infer.py),
    passed in so this module does not import the CLI that calls it."""
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
    """Rank 0: the normal run. With replicas, each request's prompts are split in order over them;
    rank 0 answers replica 0's share, gathers the others' answers and prints all in order. Each share
    and every step's tokens go to the other ranks of rank 0's replica."""
    if args.do_sample and args.seed is None:
        args.seed = int(np.random.SeedSequence().entropy % (2 ** 31))   # one seed for every rank
    options = generation_options(args).to_json()      # the request's options, as every rank receives them

    def announce(prompts):
        if replica is not None:
            replica.send_json({"prompts": prompts, "options": options})

    def distribute(prompts, local):
        shares = split_in_order(list(prompts), replicas.world_size)
        for r in range(1, replicas.world_size):
            replicas.send_json_to(r, {"prompts": shares[r], "options": options})
        results = []
        if shares[0]:
            announce(shares[0])
            results = local(shares[0])
        for r in range(1, replicas.world_size):
            results += replicas.recv_json_from(r)["results"]
        return results

    coordinator = TokenAgreement(replica) if replica is not None else None
    try:
        if replicas is None:
            run(args, before_request=announce, coordinator=coordinator)
        else:
            run(args, coordinator=coordinator, distribute=distribute)
    finally:
        for channel in (replicas, replica):
            if channel is not None:
                channel.send_json({"stop": True})


def _serve(args, replicas, replica, make_generator) -> None:
    """The first rank of replica r > 0: answer the share of each request rank 0 sends, leading the
    replica's other ranks through it."""
    generator = make_generator(args, 0)
    if replica is not None:
        generator.coordinator = TokenAgreement(replica)
    try:
        while True:
            message = replicas.recv_json()
            if message.get("stop"):
                if replica is not None:
                    replica.send_json(message)
                return
            prompts = message["prompts"]
            results = []
            if prompts:
                if replica is not None:
                    replica.send_json(message)
                results = generator.infer(prompts, options=GenerationOptions.from_json(message["options"]))
            replicas.reply_json({"results": results})
    finally:
        generator.close()


def _follow(args, channel: RankChannel, make_generator) -> None:
    """Other ranks of a replica: run each request their replica's first rank announces; write results
    to this rank's log."""
    generator = make_generator(args, channel.rank)
    generator.coordinator = TokenAgreement(channel)
    try:
        while True:
            message = channel.recv_json()
            if message.get("stop"):
                return
            for item in generator.infer(message["prompts"], options=GenerationOptions.from_json(message["options"])):
                sys.stdout.write(item["text_generation_text"][0] + "\n")
            sys.stdout.flush()
    finally:
        generator.close()
