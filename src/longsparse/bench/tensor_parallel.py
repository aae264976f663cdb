"""`longsparse bench tensor-parallel`: a model split across N GPUs (tensor parallelism over NCCL) against one GPU.

One geometry (:mod:`longsparse.bench.geometry`, default Qwen3.5-9B's) with random bf16 weights drawn per parameter
from a seed at its full shape, so every tensor-parallel size runs the same model (each rank keeps its part). For one
rank, then ``--tensor-parallel-size`` N (2 by default), the ranks are spawned as processes, one per GPU (gloo
processes on a CPU), and run, in the same order:

* prefill (``--lengths``, B = 1): one warm-up call, then the median of ``--reps`` calls, each started together
  after a barrier and timed on rank 0 with CUDA events; the last token's logits are kept for the check;
* decode (``--context`` × ``--batches``): one prefill of ``context − 1`` tokens into slot 0, its caches copied to
  every slot, one eager step (its logits kept for the check), then on a GPU the step captured as one CUDA graph
  (its collectives inside) and ``--steps`` replays timed; off a GPU, or where the capture fails (recorded), eager
  steps are timed.

A size's rows report its speedup over size 1 only where its logits of that case agree with size 1's within
``CHECK_TOL`` (relative RMSE; two bf16 forwards that sum the same products in another order). Results:
``<out>/results/tensor_parallel.json`` with ``prefill_speedup_tp2_128k`` and ``decode_speedup_tp2_b16_32k`` (and
the other lengths and batches) in its summary.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

from .._optional import require
from ..cli_args import add_tensor_parallel_size
from ..distributed import TensorParallel
from ..engine.cache import allocate_caches
from ..engine.decode_graph import GraphStepper
from ..engine.runner import ModelRunner
from ..models.attention import DECODE_BLOCK
from ..models.base import CausalLM
from ..models.modes import ExecutionModes
from ..models.parallel import parameter_shards
from ..models.registry import ARCHITECTURES
from ..reports.results import BenchmarkResult
from .geometry import GEOMETRIES
from .timing import Clock, time_steps

NAME = "tensor_parallel"
CHECK_TOL = 0.03
"""Relative RMSE within which a size's logits must agree with one GPU's for its speedup to be reported: bf16 sums of
partial products in another order (each rank's, then the all-reduce), through every layer of a random model."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--geometry", default="qwen3.5-9b", choices=sorted(GEOMETRIES))
    add_tensor_parallel_size(parser, default=2, measured="the ranks measured against one (one per GPU)")
    parser.add_argument("--lengths", default="32768,131072", help="prefill lengths (B = 1)")
    parser.add_argument("--context", type=int, default=32768, help="decode context length")
    parser.add_argument("--batches", default="16,64", help="decode batch sizes")
    parser.add_argument("--gdn", default="dense", choices=("dense", "sparse"), help="GDN mode of every run")
    parser.add_argument("--reps", type=int, default=3, help="timed prefill calls per case (after one warm-up)")
    parser.add_argument("--steps", type=int, default=20, help="timed decode steps per case")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 on a GPU, float32 on a CPU")
    parser.add_argument("--timeout-s", type=int, default=300, help="how long a collective waits for the other ranks")
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    if args.tensor_parallel_size < 2:
        raise SystemExit(
            f"--tensor-parallel-size must be at least 2 (measured against 1), got {args.tensor_parallel_size}"
        )
    sizes = [1, args.tensor_parallel_size]
    if torch.cuda.is_available() and max(sizes) > torch.cuda.device_count():
        raise SystemExit(f"--sizes asks for {max(sizes)} GPUs, this machine has {torch.cuda.device_count()}")
    if torch.cuda.is_available() and args.gdn == "dense" and importlib.util.find_spec("fla") is None:
        raise SystemExit(
            "--gdn dense on a GPU needs FLA's kernels (pip install fla-core): without them the dense GDN core is the "
            "torch reference, far too slow at these lengths to time (or measure --gdn sparse)"
        )
    options = _Options.of(args)
    outputs = {}
    with tempfile.TemporaryDirectory() as workdir:
        for size in sizes:
            mp.spawn(_rank_main, args=(size, options, Path(workdir)), nprocs=size, join=True)
            outputs[size] = torch.load(Path(workdir) / f"tp{size}.pt", weights_only=False)
    result = BenchmarkResult(NAME)
    result.rows = _compare(outputs)
    result.summary = summarise(result.rows)
    result.notes.append(
        f"{options.geometry} shapes with RANDOM weights ({options.dtype}), GDN {options.gdn}, dense attention; "
        f"speedups over one GPU where the logits agree within {CHECK_TOL} relative RMSE"
    )
    path = result.save(Path(args.out) / "results")
    for row in result.rows:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    print(f"wrote {path}")
    return 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


class _Options:
    """What a rank needs of the command line (picklable)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    @classmethod
    def of(cls, args) -> _Options:
        return cls(
            geometry=args.geometry, lengths=_ints(args.lengths), context=args.context, batches=_ints(args.batches),
            gdn=args.gdn, reps=args.reps, steps=args.steps, dtype=args.dtype, timeout_s=args.timeout_s,
            seed=args.seed,
        )  # fmt: skip


def _rank_main(rank: int, size: int, options: _Options, workdir: Path) -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads() // size))
    dtype = {"auto": torch.bfloat16 if cuda else torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp32": torch.float32, "float32": torch.float32}[options.dtype]  # fmt: skip
    parallel = TensorParallel.initialize(
        rank, size, f"file://{workdir / f'rendezvous-{size}'}", device, timeout=timedelta(seconds=options.timeout_s)
    )
    try:
        model = random_model(GEOMETRIES[options.geometry], parallel, dtype, device, options.seed)
        model.set_modes(ExecutionModes(gdn=options.gdn, attention="dense"))
        rows, logits = [], {}
        with torch.inference_mode():
            for length in options.lengths:
                rows.append(_prefill(model, parallel, length, options, logits))
            for batch in options.batches:
                rows.append(_decode(model, parallel, batch, options, logits))
        if parallel.rank == 0:
            torch.save({"rows": rows, "logits": logits}, workdir / f"tp{size}.pt")
    finally:
        parallel.close()


def random_model(geometry, parallel: TensorParallel, dtype: torch.dtype, device: torch.device, seed: int) -> CausalLM:
    """This rank's part of ``geometry``'s model with seeded random weights: every parameter is drawn at its full
    shape from a generator seeded by ``seed`` and its name's index — matrices (and the conv) N(0, 1 / fan-in), the
    others their constant initial value (norm weights, decays; biases 0) plus N(0, 0.1²) — and the rank keeps its
    part, so every tensor-parallel size holds the same model."""
    transformers = require("transformers", "the benchmark geometries (their transformers configs)")
    raw = getattr(transformers, geometry.config_class)(**geometry.config).to_dict()
    config = ARCHITECTURES[geometry.architecture].config_from_hf(raw, f"geometry {geometry.name}")
    with torch.device(device):
        model = ARCHITECTURES[geometry.architecture].model_class(config, parallel)
    model = model.to(dtype).requires_grad_(False).eval()
    shards = parameter_shards(model)
    with torch.no_grad():
        for index, (name, param) in enumerate(sorted(model.named_parameters())):
            shard = shards.get(name)
            shape = shard.full_shape(param.shape) if shard is not None else tuple(param.shape)
            gen = torch.Generator(device).manual_seed(seed * 100_003 + index)
            noise = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            if param.dim() >= 2:
                full = noise / shape[-1] ** 0.5
            else:  # a norm weight, dt_bias or A_log: built constant (ones or zeros); a bias: around 0
                full = 0.1 * noise + (0.0 if name.endswith(".bias") else param.flatten()[0].float())
            param.copy_((shard.read(full) if shard is not None else full).to(dtype))
    return model


def _prompt(config, length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed + 7 * length)
    return torch.randint(0, config.vocab_size, (length,), generator=gen).tolist()


def _prefill(model: CausalLM, parallel: TensorParallel, length: int, options, logits: dict) -> dict:
    device = model.lm_head.weight.device
    runner = ModelRunner(model)
    ids = _prompt(model.config, length, options.seed)
    runner.prefill([ids])  # compiles
    times = []
    for _ in range(options.reps):
        parallel.barrier()
        with Clock(device) as clock:
            out = runner.prefill([ids])
        times.append(clock.ms)
    logits[("prefill", length)] = out.logits[0].float().cpu()
    ms = statistics.median(times)
    return dict(phase="prefill", T=length, B=1, tp=parallel.size, ms=ms, tokens_per_s=length * 1e3 / ms)


def _copy_first_slot(*caches) -> None:
    """Every slot of the caches takes slot 0's keys, values and GDN states."""
    for cache in caches:
        for name in ("keys", "values", "conv", "recurrent"):
            for tensor in getattr(cache, name, {}).values():
                tensor[1:] = tensor[:1]


def _decode(model: CausalLM, parallel: TensorParallel, batch: int, options, logits: dict) -> dict:
    device, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
    context, steps = options.context, options.steps
    capacity = context + steps + 2
    kv, states = allocate_caches(model.rank_config, batch, capacity, dtype, device, block_size=DECODE_BLOCK)
    runner = ModelRunner(model)
    ids = _prompt(model.config, context, options.seed)
    runner.prefill([ids[:-1]], slots=[0], kv_cache=kv, gdn_states=states)
    _copy_first_slot(kv, states)
    slots, lengths = list(range(batch)), [context - 1] * batch
    out = runner.decode([ids[-1]] * batch, prefix_lens=lengths, slots=slots, kv_cache=kv, gdn_states=states)
    logits[("decode", batch)] = out.logits[0].float().cpu()
    row = dict(phase="decode", T=context, B=batch, tp=parallel.size)
    tokens = out.logits.argmax(-1)
    lengths = [n + 1 for n in lengths]
    stepper = None
    if device.type == "cuda":
        try:
            stepper = GraphStepper(model, kv, None, tokens, lengths, capacity, True, gdn_states=states)
            row["timed"] = "cuda graph"
        except RuntimeError as exc:
            row["graph_error"] = str(exc).splitlines()[0][:300]
    if stepper is None:
        stepper = _EagerSteps(runner, kv, states, tokens, lengths)
        row["timed"] = "eager"
    stepper.step()
    parallel.barrier()
    ms = time_steps(stepper, steps, device)
    row.update(ms_per_step=ms, tokens_per_s=batch * 1e3 / ms)
    del kv, states, stepper
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


class _EagerSteps:
    """Greedy eager decode steps of slots ``0 … N − 1`` (the ``step()`` :func:`time_steps` calls)."""

    def __init__(self, runner: ModelRunner, kv, states, tokens: torch.Tensor, lengths: list[int]):
        self.runner, self.kv, self.states = runner, kv, states
        self.tokens, self.lengths = tokens.tolist(), list(lengths)

    def step(self) -> None:
        out = self.runner.decode(self.tokens, prefix_lens=self.lengths, slots=list(range(len(self.lengths))),
                                 kv_cache=self.kv, gdn_states=self.states)  # fmt: skip
        self.tokens = out.logits.argmax(-1).tolist()
        self.lengths = [n + 1 for n in self.lengths]


def _compare(outputs: dict[int, dict]) -> list[dict]:
    """Every size's rows with its logits' relative RMSE from size 1's and, where within :data:`CHECK_TOL`, its
    speedup over size 1."""
    base = outputs[1]
    base_rows = {(r["phase"], r["B"] if r["phase"] == "decode" else r["T"]): r for r in base["rows"]}
    rows = []
    for size, out in outputs.items():
        for row in out["rows"]:
            key = (row["phase"], row["B"] if row["phase"] == "decode" else row["T"])
            row = dict(row)
            if size != 1:
                mine, theirs = out["logits"][key], base["logits"][key]
                err = ((mine.double() - theirs.double()).norm() / theirs.double().norm()).item()
                row["logits_rel_err_vs_tp1"] = err
                row["checked"] = bool(err <= CHECK_TOL)
                time_key = "ms" if row["phase"] == "prefill" else "ms_per_step"
                if row["checked"]:
                    row["speedup_vs_tp1"] = base_rows[key][time_key] / row[time_key]
            rows.append(row)
    return rows


def summarise(rows: list[dict]) -> dict:
    """``prefill_speedup_tp{N}_{T/1024}k`` and ``decode_speedup_tp{N}_b{B}_{T/1024}k`` of every checked row."""
    summary = {}
    for row in rows:
        if "speedup_vs_tp1" not in row:
            continue
        length = f"{row['T'] // 1024}k" if row["T"] >= 1024 else str(row["T"])
        if row["phase"] == "prefill":
            summary[f"prefill_speedup_tp{row['tp']}_{length}"] = row["speedup_vs_tp1"]
        else:
            summary[f"decode_speedup_tp{row['tp']}_b{row['B']}_{length}"] = row["speedup_vs_tp1"]
    return summary
