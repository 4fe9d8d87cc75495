"""`run_infer_main.py --distributed True`: one rank of a launched multi-rank run.

Only rank 0 reads prompts and prints. Tensor parallel: every rank runs the same request with
the same seed; rank 0's tokens are sent to the others each step, and each other rank checks that
its own choice agrees, stopping with an error on divergence instead of silently drifting.
Data parallel (`--data_parallel N`, one single-rank model per rank): rank 0 splits each request's
prompts in order over the ranks and prints the answers in input order.
"""
from __future__ import annotations

import logging
import sys

import numpy as np

from lite_runtime.contract.errors import DistributedError
from lite_runtime.distributed.data_parallel import split_in_order
from lite_runtime.distributed.rank_channel import RankChannel

log = logging.getLogger("lite_runtime.distributed")


class TokenAgreement:
    """Wraps a rank's sampler: rank 0 broadcasts its tokens; other ranks compare theirs."""

    def __init__(self, channel: RankChannel):
        self.channel = channel
        self.step = 0

    def wrap(self, sampler):
        def pick(logits, ids, lengths):
            mine = sampler(logits, ids, lengths)
            if self.channel.rank == 0:
                self.channel.send_tokens(mine)
                return mine
            theirs = self.channel.recv_tokens()
            if not np.array_equal(mine, theirs):
                raise DistributedError(f"rank {self.channel.rank} chose tokens {mine.tolist()} but rank 0 chose "
                                       f"{theirs.tolist()} at step {self.step}: the ranks diverged")
            self.step += 1
            return theirs
        return pick


def run_distributed(args, run, make_generator, generation_kwargs) -> None:
    """`run`, `make_generator` and `generation_kwargs` are the single-process CLI's (cli/run_infer.py),
    passed in so this module does not import the CLI that calls it."""
    if args.backend == "ms" and args.data_parallel == 1:
        from mindspore.communication import init
        init()   # before any graph with collectives is loaded: one without a group crashes the process
    channel = RankChannel.from_env()
    try:
        if args.data_parallel > 1:
            (_scatter if channel.rank == 0 else _serve)(args, channel, run, make_generator, generation_kwargs)
        elif channel.rank == 0:
            _lead(args, channel, run, generation_kwargs)
        else:
            _follow(args, channel, make_generator)
    finally:
        channel.close()


def _scatter(args, channel: RankChannel, run, make_generator, generation_kwargs) -> None:
    """Data parallel, rank 0: each request's prompts are split in order over the ranks (one model
    replica each); rank 0 answers its share, gathers the others' answers and prints all in order."""
    def infer(prompts, local):
        shares = split_in_order(list(prompts), channel.world_size)
        for rank in range(1, channel.world_size):
            channel.send_json_to(rank, {"prompts": shares[rank], "kwargs": generation_kwargs(args)})
        results = local(shares[0]) if shares[0] else []
        for rank in range(1, channel.world_size):
            results += channel.recv_json_from(rank)["results"]
        return results

    try:
        run(args, distribute=infer)
    finally:
        channel.send_json({"stop": True})


def _serve(args, channel: RankChannel, run, make_generator, generation_kwargs) -> None:
    """Data parallel, other ranks: answer the share of each request rank 0 sends (each rank is a
    whole replica: rank 0 of the single-rank export, on its own device)."""
    generator = make_generator(args, 0)
    try:
        while True:
            message = channel.recv_json()
            if message.get("stop"):
                return
            prompts = message["prompts"]
            results = generator.infer(prompts, **message["kwargs"]) if prompts else []
            channel.reply_json({"results": results})
    finally:
        generator.close()


def _lead(args, channel: RankChannel, run, generation_kwargs) -> None:
    """Rank 0: the normal run, with every request and step token shared with the other ranks."""
    if args.do_sample and args.seed is None:
        args.seed = int(np.random.SeedSequence().entropy % (2 ** 31))   # one seed for every rank
    def announce(prompts):
        channel.send_json({"prompts": prompts, "kwargs": generation_kwargs(args)})

    try:
        run(args, before_request=announce, coordinator=TokenAgreement(channel))
    finally:
        channel.send_json({"stop": True})


def _follow(args, channel: RankChannel, make_generator) -> None:
    """Other ranks: run each request rank 0 announces; write results to this rank's log."""
    generator = make_generator(args, channel.rank)
    generator.coordinator = TokenAgreement(channel)
    try:
        while True:
            message = channel.recv_json()
            if message.get("stop"):
                return
            for item in generator.infer(message["prompts"], **message["kwargs"]):
                sys.stdout.write(item["text_generation_text"][0] + "\n")
            sys.stdout.flush()
    finally:
        generator.close()
