"""The decode cases of `longsparse bench model`: transformers' ``generate`` with its own cache (eager over its
``DynamicCache``, and over a ``StaticCache`` with its compiled decode step) against our ``ModelRunner.decode``, at
each context length and batch size, over caches filled by one prefill and copied to every sequence (see
:mod:`longsparse.bench.model`)."""

from __future__ import annotations

import copy
import time
import traceback

import torch

from .._optional import require
from ..engine.cache import allocate_caches, allocate_compressed_keys
from ..engine.decode_graph import GraphStepper
from ..engine.decode_modes import build_cache
from ..engine.runner import ModelRunner
from .model_cases import (
    CACHE_MODE,
    DECODE_MODES,
    DENSE_TOL,
    GIB,
    HF_COMPILED,
    HF_MODES,
    Context,
    brief,
    check_logits,
    free_memory,
    guarded,
    rel_err,
    sync,
)
from .timing import time_steps

COMPILE_WARMUP_STEPS = 4
"""Decode steps of the untimed ``generate`` that compiles transformers' decode step (the first step is its uncompiled
prefill of the uncached token; "reduce-overhead" compiles, then records its CUDA graphs over the next ones)."""


class _StepTimes:
    """A ``generate`` streamer that stamps the host time of every ``put`` (the prompt, then each new token), the
    device drained first, so that each stamp follows its step's completion whatever ``generate`` queued."""

    def __init__(self, device: torch.device):
        self.stamps: list[float] = []
        self.device = device

    def put(self, value) -> None:
        sync(self.device)
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def _hf_kv_bytes(config, batch: int, context: int, dtype: torch.dtype) -> int:
    """transformers' cache for ``batch`` sequences of ``context`` tokens (KV of the attention layers)."""
    per_token = 2 * len(config.attention_layers) * config.num_key_value_heads * config.head_dim * dtype.itemsize
    return batch * context * per_token


def _fits_hf(ctx: Context, batch: int, context: int) -> str | None:
    """Why transformers' cache for ``batch`` sequences of ``context`` tokens cannot fit the free GPU memory (with
    1 GiB to spare), or None."""
    if ctx.device.type != "cuda":
        return None
    need = _hf_kv_bytes(ctx.pair.ours.config, batch, context, ctx.dtype) + GIB
    free, _ = torch.cuda.mem_get_info(ctx.device)
    if need > free:
        return f"transformers' KV cache needs {need / GIB:.1f} GiB, {free / GIB:.1f} GiB free"
    return None


def _linear_layer(layer) -> bool:
    """Whether a transformers cache layer holds a linear-attention layer's states (conv and recurrent) rather than
    keys and values."""
    return hasattr(layer, "recurrent_states")


def fill_static_cache(static, dynamic, batch: int) -> None:
    """Copy a one-sequence ``DynamicCache`` (one prefill) into every row of transformers' ``StaticCache`` ``static``
    of ``batch`` sequences, in place: each layer's tensors keep the addresses its compiled decode step captured, so
    the same static cache can be refilled between runs. Attention layers: the prompt's keys and values at positions
    ``[0, n)`` and the cache's length ``n``; linear-attention layers: the conv and recurrent states (and, where the
    version keeps one, their token count). Written against the cache layers of transformers 5.17 to 5.25."""
    for src, dst in zip(dynamic.layers, static.layers, strict=True):
        if _linear_layer(dst):
            for i, conv in src.conv_states.items():
                rec = src.recurrent_states[i]
                if conv is None or rec is None:
                    continue
                conv_b = conv.expand(batch, *conv.shape[1:]).contiguous()
                rec_b = rec.expand(batch, *rec.shape[1:]).contiguous()
                if not dst.is_conv_states_initialized[i]:
                    dst.lazy_initialization(conv_states=conv_b, recurrent_states=rec_b, state_idx=i)
                dst.conv_states[i].copy_(conv_b)
                dst.recurrent_states[i].copy_(rec_b)
                dst.has_previous_state[i] = True
            if hasattr(dst, "cumulative_length_linear"):  # transformers >= 5.2x also counts the tokens here
                dst.cumulative_length_linear.fill_(int(src.cumulative_length_linear))
        else:
            keys = src.keys.expand(batch, *src.keys.shape[1:])
            values = src.values.expand(batch, *src.values.shape[1:])
            if not dst.is_initialized:
                dst.lazy_initialization(keys, values)
            n = keys.shape[-2]
            dst.keys[:, :, :n].copy_(keys)
            dst.values[:, :, :n].copy_(values)
            dst.cumulative_length.fill_(n)


def _forced_tokens(tokens: list[int]):
    """A transformers logits processor that makes generated token ``i`` be ``tokens[i]`` in every row (the raw
    logits ``generate`` returns are untouched): two runs forced alike compute every step on the same inputs."""
    transformers = require("transformers", "the end-to-end benchmark's reference model")

    class ForcedTokens(transformers.LogitsProcessor):
        def __init__(self):
            self.start = None

        def __call__(self, input_ids, scores):
            self.start = input_ids.shape[1] if self.start is None else self.start
            step = input_ids.shape[1] - self.start
            if step < len(tokens):
                scores = torch.full_like(scores, float("-inf"))
                scores[:, tokens[step]] = 0.0
            return scores

    return transformers.LogitsProcessorList([ForcedTokens()])


def _hf_generate(hf, inputs, cache, steps: int, clock, logits: bool, forced: list[int] | None = None):
    """transformers' greedy ``generate`` of ``steps`` tokens over ``cache`` (the prompt cached, its last token not);
    ``forced``: the tokens to generate instead of the greedy ones (:func:`_forced_tokens`)."""
    processors = _forced_tokens(forced) if forced else None
    with torch.inference_mode():
        return hf.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), past_key_values=cache,
                           max_new_tokens=steps, min_new_tokens=steps, do_sample=False, streamer=clock,
                           pad_token_id=0, output_logits=logits, return_dict_in_generate=True,
                           logits_processor=processors)  # fmt: skip


def _hf_decode(ctx: Context, context: int, batches: list[int], compiled: bool = False) -> None:
    """One row per batch size: transformers' ``generate`` over its cache of one prefill, copied to the batch — its
    ``DynamicCache`` (``hf``, eager), or with ``compiled`` a ``StaticCache`` (``hf_compiled``: ``generate`` compiles
    its decode step). The compiled decode: one untimed ``generate`` compiles and records it (``compile_s``) with its
    tokens forced to the eager decode's, so that its first compiled step (the second step; the first is the
    uncompiled prefill of the uncached token) is checked against the eager one's logits on the same input; then the
    cache is refilled in place and the timed ``generate`` replays it."""
    hf, args, device = ctx.pair.hf, ctx.args, ctx.device
    mode = HF_COMPILED if compiled else "hf"
    ids = _decode_ids(ctx, context)
    prompt = context - 1
    with torch.inference_mode():
        out = hf(input_ids=ids[None, :prompt], use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        # the first step's logits by a forward pass over all the tokens: the yardstick of the decode checks' drift
        forward = hf(input_ids=ids[None], use_cache=False, logits_to_keep=1).logits[0, -1].float().cpu()
        del out
    first = ids[prompt]  # the context's own last token: every mode's first step decodes the same input
    for B in batches:
        row = ctx.log.start(geometry=ctx.pair.label, phase="decode", mode=mode, T=context, B=B)
        if ctx.note(mode):
            row["note"] = ctx.note(mode)

        def case(row=row, B=B):
            reason = _fits_hf(ctx, B, context)
            if reason:
                row.update(error="does not fit", detail=reason)
                return
            inputs = torch.cat([ids[:prompt], first[None]])[None].expand(B, -1)
            steps = args.decode_warmup + args.decode_steps
            check = B == batches[0]  # the first step's logits of one batch size are checked across modes
            eager = ctx.hf_eager_steps.get(context)  # (generated tokens, second step's logits) of the eager decode
            if compiled:
                transformers = require("transformers", "the end-to-end benchmark's reference model")
                cache_b = transformers.StaticCache(config=hf.config, max_cache_len=context + steps)
                fill_static_cache(cache_b, cache, B)
                forced = eager[0][:COMPILE_WARMUP_STEPS] if check and eager else None
                t0 = time.perf_counter()
                warm = _hf_generate(hf, inputs, cache_b, COMPILE_WARMUP_STEPS, _StepTimes(device), forced is not None,
                                    forced)  # fmt: skip
                sync(device)
                row["compile_s"] = time.perf_counter() - t0  # compilation and graph recording included
                row["compile_warmup_steps"] = COMPILE_WARMUP_STEPS
                if forced is not None:
                    second = warm.logits[1][0].float().cpu()
                    row["check_rel_vs_hf"] = rel_err(second, eager[1])
                    row["check_tol"] = DENSE_TOL
                    row["check_finite"] = bool(torch.isfinite(second).all())
                    row["checks_pass"] = row["check_finite"] and row["check_rel_vs_hf"] <= DENSE_TOL
                elif check:
                    row["check_note"] = "no eager transformers decode in this run to compare the compiled step with"
                del warm
                fill_static_cache(cache_b, cache, B)
            else:
                cache_b = copy.deepcopy(cache)
                cache_b.reorder_cache(torch.zeros(B, dtype=torch.long, device=device))
            clock = _StepTimes(device)
            out = _hf_generate(hf, inputs, cache_b, steps, clock, check and not compiled)
            if check and not compiled:
                check_logits(row, ctx, "hf", ("decode", context), out.logits[0][0])
                drift = rel_err(out.logits[0][0].float().cpu(), forward)
                row["check_step_vs_forward"] = ctx.hf_step_drift[("decode", context)] = drift
                tokens = out.sequences[0, -steps:].tolist()
                ctx.hf_eager_steps[context] = (tokens, out.logits[1][0].float().cpu())
            del out
            # every step decoded one token over the copied cache (nothing re-prefilled): prompt + steps cached
            # (int(): transformers 5.25 returns the length as a tensor)
            row["check_hf_cache_tokens_ok"] = int(cache_b.get_seq_length()) == prompt + steps
            del cache_b
            w = args.decode_warmup  # stamps[0] is the prompt, stamps[k] follows decode step k
            seconds = clock.stamps[w + args.decode_steps] - clock.stamps[w]
            row["ms_per_step"] = seconds * 1e3 / args.decode_steps
            row["tokens_per_s"] = B * args.decode_steps / seconds

        guarded(row, ctx, case)
        print(f"decode {ctx.pair.label} {mode} ctx={context} B={B}: {brief(row)}", flush=True)


def _decode_ids(ctx: Context, context: int) -> torch.Tensor:
    vocab = ctx.pair.ours.config.vocab_size
    gen = torch.Generator().manual_seed(ctx.args.seed + 7 * context)
    return torch.randint(0, vocab, (context,), generator=gen).to(ctx.device)


def _ours_caches(ctx: Context, mode: str, num: int, capacity: int):
    config, model = ctx.pair.ours.config, ctx.pair.ours
    kv = build_cache(config, CACHE_MODE[mode], num, capacity, ctx.dtype, ctx.device, ctx.pair.sparse)
    _, states = allocate_caches(config, num, capacity, ctx.dtype, ctx.device, kv_cache=False)
    return kv, states, allocate_compressed_keys(model, num, capacity)


def _replicate(src, dst) -> None:
    """Copy slot 0 of the caches ``src`` (kv, GDN states, compressed keys) into every slot of ``dst``."""
    for a, b in zip(src, dst):
        if a is None:
            continue
        for name in ("keys", "values", "conv", "recurrent", "k_cmp", "ring"):
            for layer, tensor in getattr(a, name, {}).items():
                target = getattr(b, name)[layer]
                target.copy_(tensor[:1].expand_as(target))


def _ours_decode(ctx: Context, mode: str, context: int, batches: list[int]) -> None:
    """One row per batch size: our decode steps in ``mode`` over the caches of one prefill, copied to the batch —
    eager steps through :class:`ModelRunner` (the first one checked), then, on a GPU, the same step captured as a
    CUDA graph and replayed (the reported figures; the eager ones stay as ``eager_*``)."""
    args, device = ctx.args, ctx.device
    ctx.set_mode(mode)
    model = ctx.pair.ours
    runner = ModelRunner(model)
    ids = _decode_ids(ctx, context)
    prompt = context - 1
    steps = args.decode_warmup + args.decode_steps
    graphs = device.type == "cuda"
    capacity = context + steps + (1 + args.decode_steps if graphs else 0)
    source = kv, states, ck = _ours_caches(ctx, mode, 1, capacity)
    runner.prefill([ids[:prompt].tolist()], slots=[0], kv_cache=kv, gdn_states=states, compressed_keys=ck)
    # the context's own last token, not this mode's argmax: the checked first step then has the same input in every
    # mode (bf16 argmaxes of a random model's near-tied logits differ between implementations)
    first = int(ids[prompt])
    for B in batches:
        row = ctx.log.start(geometry=ctx.pair.label, phase="decode", mode=mode, T=context, B=B)
        if ctx.note(mode):
            row["note"] = ctx.note(mode)

        def case(row=row, B=B):
            kv_b, states_b, ck_b = caches = _ours_caches(ctx, mode, B, capacity)
            _replicate(source, caches)
            tokens, lengths = [first] * B, [prompt] * B
            stamps = []
            for step in range(steps):
                if step == args.decode_warmup:
                    sync(device)
                    stamps.append(time.perf_counter())
                out = runner.decode(tokens, prefix_lens=lengths, slots=list(range(B)), kv_cache=kv_b,
                                    gdn_states=states_b, compressed_keys=ck_b)  # fmt: skip
                if step == 0 and B == batches[0]:
                    check_logits(row, ctx, mode, ("decode", context), out.logits[0])
                tokens = out.logits.argmax(-1).tolist()
                lengths = [n + 1 for n in lengths]
            sync(device)
            seconds = time.perf_counter() - stamps[0]
            row["eager_ms_per_step"] = row["ms_per_step"] = seconds * 1e3 / args.decode_steps
            row["eager_tokens_per_s"] = row["tokens_per_s"] = B * args.decode_steps / seconds
            row["timed"] = "eager"
            row["kv_gib"] = kv_b.nbytes().gpu / GIB
            if graphs:
                _graph_steps(row, model, caches, tokens, lengths, capacity, mode == "dense", args.decode_steps, device)

        guarded(row, ctx, case)
        print(f"decode {ctx.pair.label} {mode} ctx={context} B={B}: {brief(row)}", flush=True)


def _graph_steps(row, model, caches, tokens, lengths, capacity, dense, steps, device) -> None:
    """Capture one decode step as a CUDA graph (continuing from ``tokens`` / ``lengths``), replay it once to warm
    up, then time ``steps`` replays into ``row`` — which then reports them; a failed capture is recorded and the
    eager figures stand."""
    kv, states, compressed = caches
    ids = torch.tensor(tokens, device=device)
    with torch.inference_mode():
        try:
            graph = GraphStepper(model, kv, compressed, ids, lengths, capacity, dense, gdn_states=states)
        except RuntimeError as exc:
            row["graph_error"] = str(exc).splitlines()[0][:300]
            return
        graph.step()
        ms = time_steps(graph, steps, device)
    row["graph_ms_per_step"] = row["ms_per_step"] = ms
    row["graph_tokens_per_s"] = row["tokens_per_s"] = len(tokens) * 1e3 / ms
    row["timed"] = "cuda graph"


def run_decode(ctx: Context, contexts: list[int], batches: list[int], modes: list[str]) -> None:
    """Every decode case of ``modes`` (transformers' first: the reference of the checks)."""
    for context in contexts:
        for mode in [m for m in DECODE_MODES if m in modes]:
            reason = ctx.skip_reason(mode)
            if reason:
                for B in batches:
                    row = ctx.log.start(geometry=ctx.pair.label, phase="decode", mode=mode, T=context, B=B)
                    row["skipped"] = reason
                ctx.log.save()
                continue
            try:
                if mode in HF_MODES:
                    _hf_decode(ctx, context, batches, compiled=mode == HF_COMPILED)
                else:
                    _ours_decode(ctx, mode, context, batches)
            except Exception as exc:  # the prefill that fills the cache failed: every batch of it says so
                if not isinstance(exc, torch.cuda.OutOfMemoryError):
                    traceback.print_exc()
                for B in batches:
                    row = ctx.log.start(geometry=ctx.pair.label, phase="decode", mode=mode, T=context, B=B)
                    row.update(error="prefill of the decode context failed: " + type(exc).__name__,
                               detail=str(exc).splitlines()[0][:300] if str(exc) else "")  # fmt: skip
                ctx.log.save()
            free_memory(ctx.device)
