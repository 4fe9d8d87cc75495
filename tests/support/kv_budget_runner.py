"""python tests/support/kv_budget_runner.py EXPORT BLOCKS PREFIX_BYTES [DTYPE]: the demo prompts as requests
submitted together to the engine on real Lite, with the paged store (of DTYPE, default float16) cut to BLOCKS
blocks (0: the default size) and a prefix cache of PREFIX_BYTES (0: none); prints {tokens, reasons, preemptions,
held, entries}."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lite_runtime.backends import load_session  # noqa: E402
from lite_runtime.contract.manifest import load_manifest  # noqa: E402
from lite_runtime.decode.engine import Engine, EngineRequest  # noqa: E402
from support.prefix_cache_runner import prompt_ids  # noqa: E402

NEW_TOKENS = 90


def main(export, blocks, prefix_bytes, dtype="float16"):
    m = load_manifest(export)
    d = m.dims
    hd = d.head_dim
    per_position = {"float16": 2 * hd, "float32": 4 * hd, "int8": hd + 4 * -(-hd // 32)}[dtype]    # int8: scales
    block_bytes = 2 * d.num_layers * d.kv_heads_per_rank * d.kv_block * per_position     # K and V
    session = load_session("mslite", m, kv_cache_dtype=dtype,
                           kv_cache_gb=blocks * block_bytes / 2 ** 30 if blocks else None)
    engine = Engine(session, threaded=False, prefix_cache_bytes=prefix_bytes)
    ids = prompt_ids(export)
    prompts = ids + [ids[0][:20], ids[1] + ids[2][-5:]]
    tokens, reasons = [[] for _ in prompts], [None] * len(prompts)
    for i, prompt in enumerate(prompts):
        engine.submit(EngineRequest(prompt, NEW_TOKENS, on_token=lambda t, _, i=i: tokens[i].append(t),
                                    on_finish=lambda r, i=i: reasons.__setitem__(i, r)))
    engine.run_until_idle()
    cache = session.cache
    entries = engine.prefix._entries.values() if engine.prefix else []
    print(repr(dict(tokens=tokens, reasons=reasons, preemptions=engine.scheduler.preemptions, held=cache.held_blocks,
                    total=cache.total_blocks, entries=sorted({b for e in entries for b in e.blocks}))))
    session.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
    assert "mindspore" not in sys.modules
