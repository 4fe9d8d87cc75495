"""`python -m lite_runtime.serve --model_dir out/x [--host 127.0.0.1] [--port 8000] [--backend mslite]`
(console script `lite-serve`): the export behind an OpenAI-compatible endpoint."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import click

from lite_runtime.backends.kv_cache import PackedKVCache
from lite_runtime.contract.command_line import BOOL, CONTEXT, entry_point
from lite_runtime.contract.families import KV_CACHE_DTYPES
from lite_runtime.contract.errors import ConfigError, ToolchainError
from lite_runtime.decode.engine import PREFILL_CHUNK, Engine
from lite_runtime.decode.draft import DraftModel
from lite_runtime.decode.speculation import DraftSpec, Speculation
from lite_runtime.tokenizers.chat_template import chat_tuned_sign
from lite_runtime.tokenizers import export_tokenizer

PROG = "python -m lite_runtime.serve"


@click.command(context_settings=CONTEXT)
@click.option("--model_dir", required=True, help="The export folder (its manifest.json).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--backend", type=click.Choice(["mslite", "ms"]), default="mslite", show_default=True)
@click.option("--served_model_name", default=None, help="The model name clients send (default: the folder's name).")
@click.option("--num_threads", type=click.IntRange(1, None), default=2, show_default=True)
@click.option("--kv_cache_dtype", type=click.Choice(KV_CACHE_DTYPES), default=KV_CACHE_DTYPES[0], show_default=True,
              help="What an `attention: paged` export's KV store holds (backend mslite).")
@click.option("--kv_cache_gb", type=click.FloatRange(0, None, min_open=True), default=None,
              help="GiB of an `attention: paged` export's KV store (backend mslite), cached prefixes included: "
                   "requests are admitted while it has room, and the newest is preempted (fed again later) when "
                   "a running one needs a block. Default: every row's seq_length, within half the memory available.")
@click.option("--int8_activations", type=BOOL, default=False, show_default=True,
              help="The products of `weights: int8` (in groups of 32) on int8 activations, as llama.cpp's Q8_0 "
                   "computes them (AVX512-VNNI, backend mslite): faster at many rows, slightly other numbers.")
@click.option("--max_waiting", type=click.IntRange(1, None), default=64, show_default=True,
              help="Requests that may wait for a cache row; more are answered 429 at once.")
@click.option("--max_step_tokens", type=click.IntRange(1, None), default=PackedKVCache.max_tokens, show_default=True,
              help="Most tokens one step computes (a packed export): decoding rows go first, prompts fill the "
                   "rest. Smaller keeps decoding rows' inter-token time steady while prompts join; larger "
                   "gives new prompts their first token sooner. A request alone goes in calls of up to 512 "
                   "tokens (paged store) or whole.")
@click.option("--prefill_chunk", type=click.IntRange(1, None), default=PREFILL_CHUNK, show_default=True,
              help="Most prompt tokens one request feeds in a step while others run; a longer prompt goes over "
                   "several steps. A request alone is fed whole (in one step: faster, with less memory).")
@click.option("--prefix_cache_gb", type=click.FloatRange(0, None), default=None,
              help="Keep recent prompts' K/V up to this many GiB and reuse the prefix a new prompt shares with "
                   "one (a chat's system prompt and history): only the rest is prefilled. 0: off. Default: on an "
                   "`attention: paged` export (backend mslite) on one rank, within its KV store (cached prompts keep "
                   "blocks no running request holds, least recent given up first); elsewhere off.")
@click.option("--speculative", default=None, metavar="ngram[:K] | draft:DIR[:K]",
              help="Speculative decoding: each decoding row also feeds up to K (default 4) guessed tokens and "
                   "keeps those the model confirms; the text is the same. ngram: guessed from the row's own text "
                   "(prompt lookup), helps answers that quote their input (edits, summaries); draft:DIR: by a "
                   "small export with the same tokenizer (its cache rows cost memory too). Packed exports.")
@click.option("--shutdown_timeout", type=float, default=10.0, show_default=True,
              help="Seconds running requests get to finish after SIGTERM / Ctrl-C.")
@click.option("--distributed", type=BOOL, default=False,
              help="Set by the launcher: this process is one rank of a launched run; rank 0 serves.")
@click.option("--data_parallel", type=click.IntRange(1, None), default=1, show_default=True,
              help="Under the launcher: replicas of the export, each on as many ranks as the export has, "
                   "behind rank 0's endpoint.")
def command(model_dir, host, port, backend, served_model_name, num_threads, kv_cache_dtype, kv_cache_gb,
            int8_activations, max_waiting, max_step_tokens, prefill_chunk, prefix_cache_gb, speculative,
            shutdown_timeout, distributed, data_parallel):
    """Serve an export with continuous batching: /v1/completions, /v1/chat/completions, /v1/models,
    TGI's /generate and /generate_stream, /health, /metrics."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.serve.app import create_app
    from lite_runtime.serve.runs import ServedModel
    from lite_runtime.serve.metrics import Metrics
    from lite_runtime.serve import ranks
    from lite_runtime.distributed.data_parallel import ReplicaLayout

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    speculation = Speculation.parse(speculative, drafts=True) if speculative else None
    if distributed and isinstance(speculation, DraftSpec):
        raise ConfigError(f"--speculative {speculative!r}: a draft model runs on one process; under the launcher "
                          "use --speculative ngram[:K]")
    if int8_activations and backend != "mslite":
        raise ConfigError(f"--int8_activations runs backend mslite's kernels on int8 activations; backend {backend} "
                          "has none: leave it off")
    if kv_cache_gb is not None and backend != "mslite":
        raise ConfigError(f"--kv_cache_gb sizes the paged KV store of backend mslite; backend {backend} keeps its "
                          "K/V in host arrays: leave --kv_cache_gb unset")
    guessing = _speculation_text(speculation)
    manifest = load_manifest(model_dir)
    manifest.verify_files()
    if isinstance(speculation, DraftSpec):     # checked against the target's manifest, loaded once
        speculation = DraftModel.load(speculation, manifest, backend, num_threads)
    tokenizer = export_tokenizer(manifest)
    if tokenizer is None:
        raise ToolchainError(f"{model_dir} has no tokenizer; serving needs one (export with a tokenizer)")
    if not distributed and manifest.world_size > 1:
        raise ToolchainError(f"{model_dir} has {manifest.world_size} ranks: serve it under the launcher, python -m "
                             "lite_runtime.cli.launch --rank_table FILE -- -m lite_runtime.serve --model_dir ...")
    channel = ranks.join(model_dir, manifest, data_parallel) if distributed else None
    rank = ReplicaLayout(channel.rank, data_parallel, manifest.world_size).model_rank if channel else 0
    session = load_session(backend, manifest, rank=rank, num_threads=num_threads,
                           **({"kv_cache_dtype": kv_cache_dtype, "kv_cache_gb": kv_cache_gb,
                               "int8_activations": int8_activations} if backend == "mslite"
                              else {}))
    if channel is not None and channel.rank > 0:
        return ranks.serve_as_follower(session, channel)
    metrics = Metrics()

    def make_engine(session_of_a_replica):
        return Engine(session_of_a_replica, max_waiting=max_waiting, prefill_chunk=prefill_chunk, metrics=metrics,
                      max_step_tokens=max_step_tokens,
                      prefix_cache_bytes=None if prefix_cache_gb is None else int(prefix_cache_gb * 2 ** 30),
                      speculation=speculation)
    engine = ranks.rank0_engine(session, channel, make_engine) if channel else make_engine(session)
    metrics.cache_rows.set(manifest.batch_size * (data_parallel if channel else 1))
    name = served_model_name or os.path.basename(os.path.abspath(model_dir))
    served = ServedModel(engine, tokenizer, name, metrics)
    app = create_app(served)
    log = logging.getLogger("lite_runtime.serve")
    log.info("serving %s (%s, %d cache rows, %s, prefix cache %s, speculation %s) on http://%s:%d; chats: %s",
             name, manifest.family, manifest.batch_size, session.runtime,
             _prefix_text(engine, prefix_cache_gb), guessing, host, port,
             served.chat.describe())
    why = chat_tuned_sign(tokenizer.path, os.path.basename(os.path.abspath(model_dir)))
    if served.chat.published is None and why:
        log.warning("the export's tokenizer looks chat-tuned (%s) but the export has no chat template: chats get "
                    "the %s family's format, which the model may not follow; export it again from a folder with "
                    "its template (chat_template.jinja)", why, manifest.family)
    server = _draining_server(app, host, port, engine, shutdown_timeout)
    # uvicorn stops on SIGTERM / Ctrl-C, then raises the signal again for the handler found before it:
    # this one, so that a requested stop exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run()
    finally:
        if server.drain is not None:
            server.drain.join()
        else:       # uvicorn did not start (its port was taken)
            engine.stop(timeout=shutdown_timeout)
        for replica in engine.replicas:
            log.info("engine: %s", replica.summary())
            replica.session.close()
        if isinstance(speculation, DraftModel):
            speculation.close()
        if channel is not None:
            channel.close()


def _prefix_text(engine, prefix_cache_gb) -> str:
    prefix = engine.replicas[0].prefix
    if prefix is None:
        return "off"
    return f"{prefix_cache_gb:g} GiB" if prefix_cache_gb else "on, within the KV store"


def _speculation_text(speculation) -> str:
    if speculation is None:
        return "off"
    if isinstance(speculation, DraftSpec):
        return f"draft:{speculation.folder}:{speculation.k}"
    return f"ngram:{speculation.k}"


# uvicorn's own timeout, past the engine's: what it still cancels is logged with a traceback, and the
# client's stream ends without its last chunk
ABORT_GRACE = 10.0


def _draining_server(app, host: str, port: int, engine, shutdown_timeout: float):
    """uvicorn's server, which on SIGTERM / Ctrl-C stops accepting as usual and also stops the engine (in
    a thread: `Engine.stop`): running requests get `shutdown_timeout` seconds, then each ends with the
    finish reason `abort`, so that every answer, streamed or not, is completed by the app before uvicorn's
    graceful-shutdown timeout, `ABORT_GRACE` later, would cancel it mid-answer."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        drain = None

        async def shutdown(self, *args, **kwargs):
            # uvicorn's shutdown waits for the open connections' answers: they end once the engine has stopped
            self.drain = threading.Thread(target=engine.stop, args=(shutdown_timeout,), name="drain")
            self.drain.start()
            await super().shutdown(*args, **kwargs)

    return DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                         timeout_graceful_shutdown=shutdown_timeout + ABORT_GRACE))


main = entry_point(command, PROG)

if __name__ == "__main__":
    sys.exit(main())
