"""Training the Forecast projections of a frozen model (SparDA (Fu et al., arXiv:2606.04511) Sec. 4.2, App. B, Table 5).

One optimizer step draws ``batch_size`` sequences of ``seq_len`` tokens and, in each, ``positions`` query positions
where the selector makes a real choice (more than ``k`` candidates). The frozen model runs each sequence once
(:func:`~longsparse.models.capture.capture_attention`); then, for every attention layer ``t``, the teacher scores
of ``t``'s own queries are compared with the student scores of the forecast from ``t``'s source layer (the previous
attention layer, or ``t`` itself for the first) by the rest-bucket KL of :mod:`longsparse.train.objective`. The
loss is the sum over layers of the KL averaged over positions and GQA groups. Only the projections have gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..models.base import CausalLM
from ..models.capture import capture_attention
from ..models.forecast import ForecastProjections, forecast_source, forecast_states, init_from_queries, init_random
from ..ops.sparse_attn.config import SparseAttentionConfig
from ..ops.sparse_attn.naive import compress_keys_ref
from ..tasks.streams import TokenStream, draw_positions, draw_sequence, step_rng
from .checkpoint import load_checkpoint, save_checkpoint
from .objective import (
    candidate_mask,
    check_fine_grid,
    dynamic_budget,
    rest_bucket_kl,
    student_logits,
    supervised_positions,
    teacher_mass_recall,
    teacher_scores,
)

SHORT_CONTEXT_SPARSE = SparseAttentionConfig(
    block_size=64, init_blocks=1, window=512, topk=16, kernel_size=32, kernel_stride=16, dense_len=0
)
"""Block selection for an 8K-context model such as SmolLM2: 64-token blocks, (32, 16) compression, 1 init block, a
512-token local window and 24 blocks per query (1 init + 9 local + 14 chosen). MiniCPM4's geometry (2048-token
window, 96 blocks) would attend every block of an 8K sequence and leave nothing to select."""

TEACHERS = ("fine", "coarse")
INITS = ("query", "random")


@dataclass(frozen=True)
class ForecastTrainingConfig:
    """Hyper-parameters of a Forecast training run (defaults: the optimizer of the paper's Table 5).

    ``seq_len`` tokens per sequence; ``batch_size`` sequences per optimizer step; ``steps`` optimizer steps;
    ``positions`` supervised query positions per sequence. ``teacher``: ``fine`` (the ``fine_grid`` teacher
    max-pooled onto the student grid) or ``coarse`` (the student grid itself, the paper's ablation, Table 6).
    ``partition_k``: teacher candidates kept as separate cells (default: the selector's dynamic block budget,
    :func:`~longsparse.train.objective.dynamic_budget`). ``amp``: bf16 autocast of the student (None: on CUDA only).
    ``init``: ``query`` (:func:`~longsparse.models.forecast.init_from_queries`) or ``random``. ``teacher_chunk``:
    queries per chunk of teacher scores. ``checkpoint_every``: steps between checkpoints (and at the end).
    """

    seq_len: int = 4096
    batch_size: int = 1
    steps: int = 2000
    positions: int = 512
    teacher: str = "fine"
    fine_grid: tuple[int, int] = (2, 1)
    partition_k: int | None = None
    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-6
    grad_clip: float = 0.5
    amp: bool | None = None
    init: str = "query"
    seed: int = 0
    teacher_chunk: int = 128
    checkpoint_every: int = 25
    sparse: SparseAttentionConfig = field(default_factory=lambda: SHORT_CONTEXT_SPARSE)

    def __post_init__(self):
        object.__setattr__(self, "fine_grid", tuple(self.fine_grid))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if isinstance(self.sparse, dict):
            object.__setattr__(self, "sparse", SparseAttentionConfig(**self.sparse))
        for name in ("seq_len", "batch_size", "steps", "positions", "teacher_chunk", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.teacher not in TEACHERS:
            raise ValueError(f"teacher must be one of {', '.join(TEACHERS)}, got {self.teacher!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        check_fine_grid(*self.fine_grid, self.sparse)
        if self.partition_k is not None and (not isinstance(self.partition_k, int) or self.partition_k <= 0):
            raise ValueError(f"partition_k must be a positive int or None, got {self.partition_k!r}")
        if self.k <= 0:
            raise ValueError(f"the sparse geometry leaves no dynamic blocks to choose (budget {self.k})")
        if not self.lr > 0 or self.weight_decay < 0 or not self.eps > 0 or not self.grad_clip > 0:
            raise ValueError(
                f"need lr > 0, weight_decay >= 0, eps > 0, grad_clip > 0; got lr={self.lr}, "
                f"weight_decay={self.weight_decay}, eps={self.eps}, grad_clip={self.grad_clip}"
            )
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if supervised_positions(self.seq_len, self.sparse, self.k).numel() == 0:
            raise ValueError(
                f"seq_len={self.seq_len} has no query position with more than k={self.k} candidates under "
                f"{self.sparse}; use longer sequences or a smaller window"
            )

    @property
    def k(self) -> int:
        """Separate cells of the partition."""
        return dynamic_budget(self.sparse) if self.partition_k is None else self.partition_k

    @property
    def fine(self) -> tuple[int, int] | None:
        return self.fine_grid if self.teacher == "fine" else None

    def to_dict(self) -> dict:
        data = asdict(self)
        data["fine_grid"], data["betas"] = list(self.fine_grid), list(self.betas)
        return data

    def same_run(self, other: ForecastTrainingConfig) -> bool:
        """Whether ``other`` continues this run (it may only change ``steps`` and ``checkpoint_every``)."""
        return replace(self, steps=1, checkpoint_every=1) == replace(other, steps=1, checkpoint_every=1)


@dataclass
class TrainingResult:
    projections: ForecastProjections
    history: list[dict]


def sequence_loss(
    model: CausalLM,
    projections: ForecastProjections,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    config: ForecastTrainingConfig,
) -> tuple[torch.Tensor, dict[int, float], float]:
    """Loss of one sequence (sum over attention layers of the mean rest-bucket KL), the per-layer KL values and the
    mean teacher-mass recall of the student's top-k (see :func:`~longsparse.train.objective.teacher_mass_recall`)."""
    captures = capture_attention(model, input_ids, positions)
    device = projections_device(projections)
    positions = positions.to(device)
    cos, sin = model.rotary(positions)
    amp = (device.type == "cuda") if config.amp is None else config.amp
    sparse, k = config.sparse, config.k
    total = torch.zeros((), device=device)
    per_layer: dict[int, float] = {}
    recalls = []
    attention = model.config.attention_layers
    for target in attention:
        cap, src = captures[target], captures[forecast_source(attention, target)]
        with torch.no_grad():
            teacher = teacher_scores(cap.q, cap.k, positions, sparse, fine=config.fine, chunk=config.teacher_chunk)
            k_cmp = compress_keys_ref(cap.k[None].float(), sparse.kernel_size, sparse.kernel_stride)[0][0]
            cand = candidate_mask(positions, k_cmp.shape[0], sparse)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            weight = projections.weight_for(target, attention)
            f = forecast_states(weight, src.x.float(), cos, sin, projections.num_kv_heads)
            logits = student_logits(f, k_cmp)
        kl = rest_bucket_kl(teacher, logits, cand, k).mean()
        total = total + kl
        per_layer[target] = kl.item()
        recalls.append(teacher_mass_recall(teacher, logits.detach(), cand, k).mean().item())
    return total, per_layer, sum(recalls) / len(recalls)


def projections_device(projections: ForecastProjections) -> torch.device:
    return next(projections.parameters()).device


def new_projections(model: CausalLM, config: ForecastTrainingConfig, base_model: str, data: str) -> ForecastProjections:
    """Projections for ``model`` initialised as ``config.init`` says, float32 on the model's device; the adapter
    records the selection geometry and the training run (teacher, config, data)."""
    training = {"teacher": config.teacher, "config": config.to_dict(), "data": data}
    projections = ForecastProjections.for_model(
        model.config, base_model, sparse_config=config.sparse, training=training
    )
    if config.init == "query":
        init_from_queries(projections, model)
    else:
        init_random(projections, config.seed)
    return projections.to(device=model.lm_head.weight.device, dtype=torch.float32)


def make_optimizer(projections: ForecastProjections, config: ForecastTrainingConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        projections.parameters(), lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
    )


def train_forecast(
    model: CausalLM,
    stream: TokenStream,
    config: ForecastTrainingConfig,
    *,
    base_model: str,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    log: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[int, ForecastProjections], None] | None = None,
    progress: bool = True,
) -> TrainingResult:
    """Train Forecast projections for the frozen ``model`` on ``stream``.

    ``checkpoint``: where to save (every ``config.checkpoint_every`` steps and at the end); with ``resume`` an
    existing checkpoint there is continued (its config must be the same run, see
    :meth:`ForecastTrainingConfig.same_run`) and the result equals that of an uninterrupted run. ``log`` receives one
    dict per optimizer step (step, loss, recall, per-layer KL, gradient norm, seconds); ``on_checkpoint(step,
    projections)`` runs after each checkpoint (e.g. to keep an adapter per checkpoint). ``progress`` shows a bar.
    """
    model.requires_grad_(False).eval()
    projections = new_projections(model, config, base_model, stream.name)
    optimizer = make_optimizer(projections, config)
    history: list[dict] = []
    start = 0
    if resume and checkpoint is not None and Path(checkpoint).is_file():
        state = load_checkpoint(checkpoint)
        saved = ForecastTrainingConfig(**state["config"])
        if not saved.same_run(config):
            raise ValueError(f"checkpoint {checkpoint} belongs to another run: {saved} vs {config}")
        projections.load_state_dict(state["projections"])
        optimizer.load_state_dict(state["optimizer"])
        start, history = int(state["step"]), list(state["history"])
    eligible = supervised_positions(config.seq_len, config.sparse, config.k)
    bar = _progress_bar(config.steps, start, progress)
    params = list(projections.parameters())
    for step in range(start, config.steps):
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        losses, recalls, layer_sums = [], [], {}
        for index in range(config.batch_size):
            rng = step_rng(config.seed, step, index)
            ids = draw_sequence(stream, config.seq_len, rng)
            positions = draw_positions(eligible, config.positions, rng)
            loss, per_layer, recall = sequence_loss(model, projections, ids, positions, config)
            (loss / config.batch_size).backward()
            losses.append(loss.item())
            recalls.append(recall)
            for layer, v in per_layer.items():
                layer_sums[layer] = layer_sums.get(layer, 0.0) + v / config.batch_size
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip).item()
        optimizer.step()
        record = {
            "step": step + 1,
            "loss": sum(losses) / len(losses),
            "recall": sum(recalls) / len(recalls),
            "grad_norm": grad_norm,
            "seconds": time.perf_counter() - began,
            "layer_kl": {str(k): round(v, 5) for k, v in layer_sums.items()},
        }
        history.append(record)
        if log is not None:
            log(record)
        if bar is not None:
            bar.set_postfix(loss=f"{record['loss']:.4f}", recall=f"{record['recall']:.3f}")
            bar.update(1)
        if checkpoint is not None and ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps):
            save_checkpoint(
                checkpoint,
                {
                    "step": step + 1,
                    "projections": projections.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "config": config.to_dict(),
                    "history": history,
                },
            )
            if on_checkpoint is not None:
                on_checkpoint(step + 1, projections)
    if bar is not None:
        bar.close()
    return TrainingResult(projections, history)


def _progress_bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="forecast", unit="step", disable=False)
