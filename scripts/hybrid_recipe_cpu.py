"""Try a training recipe of the hybrid on a CPU in half an hour: a tiny model (hidden 64, 4 layers alternating GDN and
attention, GDN heads 2 / 4 of 32 channels), 256-token rows, 4,096 tokens a step, then two probes of what it learnt:

* copy rows (random tokens, then the same again): loss on the first half against loss on the repeat. Equal losses
  mean the model cannot copy from its context at all (no induction heads); a repeat far cheaper means it can.
* niah_single_1 at 256 tokens: the share of answer tokens the model predicts (teacher forced). The format tokens
  (space, full stop, end) are 3 of 10, so ~0.3 is chance; exact match needs all 7 digits.

    python scripts/hybrid_recipe_cpu.py ARM --steps 800 --out /tmp/recipe-ARM   # ~27 min on one core

ARM is one of ``RECIPES``. The runs behind docs/hybrid.md ("What the first run showed") used --steps 800; the copy
drill's (``drill``, ``drill-256``, ``drill --wide``) --steps 400 (~8 min each; --wide ~4 s a step).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from longsparse.train import DataConfig, HybridDataMix, HybridModelConfig, RunConfig, TrainConfig, train
from longsparse.train.model import import_qwen35_modeling
from longsparse.train.tokenizer import load_trained

MODEL = HybridModelConfig(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, full_attention_interval=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
    linear_value_head_dim=32, max_position_embeddings=4096,
)  # fmt: skip
# --wide: the default model's width, depth and attention (hidden 192, 8 layers, attention 4 / 2 heads of 64) with the
# tiny GDN layers (the real ones take ~12 s a step on the CPU): does width change when copying starts?
WIDE_MODEL = dataclasses.replace(
    HybridModelConfig(), linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
    linear_value_head_dim=32, max_position_embeddings=4096,
)  # fmt: skip
TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_1")
# every share pinned, so that an arm means the same whatever the library's defaults become
BASE = DataConfig(seq_lens=(256,), stage_ends=(1.0,), tokens_per_step=4096, text_fraction=0.3, copy_fraction=0.0,
                  copy_tokens="stream", extra_query_share=0.0, prompt_loss=True, tasks=TASKS)  # fmt: skip
FULL = dataclasses.replace(  # the default shares: text 10 %, copy 30 %, extra questions 0.5
    BASE, text_fraction=0.1, copy_fraction=0.3, extra_query_share=0.5, tasks=(*TASKS, "niah_multikey_2")
)
RECIPES = {
    "base": BASE,  # text 30%, retrieval 70%, LM loss on prompts
    "no-prompt-loss": dataclasses.replace(BASE, prompt_loss=False),
    "copy": dataclasses.replace(BASE, text_fraction=0.1, copy_fraction=0.3),
    "full": FULL,
    "full-uniform": dataclasses.replace(FULL, copy_tokens="uniform"),
    # the same with a quarter of the steps at 256 tokens, then 1K rows (held out at 1K too): does retrieval carry?
    "full-uniform-1k": dataclasses.replace(FULL, copy_tokens="uniform", seq_lens=(256, 1024), stage_ends=(0.25, 1.0)),
    # the copy drill: copy rows only (uniform tokens); at 64 tokens the tiny model starts copying, at 256 it does not
    "drill": dataclasses.replace(BASE, seq_lens=(64,), text_fraction=0.0, copy_fraction=1.0, copy_tokens="uniform"),
    "drill-256": dataclasses.replace(BASE, text_fraction=0.0, copy_fraction=1.0, copy_tokens="uniform"),
    "copy-heavy": dataclasses.replace(
        BASE, text_fraction=0.0, copy_fraction=0.5, extra_query_share=0.5, tasks=(*TASKS, "niah_multikey_2")
    ),  # fmt: skip
}


def probe(folder: Path, tokenizer, corpora=None) -> dict[str, float]:
    """Copy-row losses (first half, repeat) and niah_single_1 answer-token accuracy of an exported run."""
    modeling = import_qwen35_modeling(False)
    model = modeling.Qwen3_5ForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    mix = HybridDataMix(tokenizer, dataclasses.replace(BASE, tasks=("niah_single_1",)), corpora)
    rng = np.random.default_rng(5)
    ids = torch.tensor([mix.copy_row(rng, 256).ids[:256] for _ in range(8)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(8, 255)
    shares = []
    for i in range(16):
        row = mix.retrieval_row("niah_single_1", 256, i, seed=3_000_000)
        x = torch.tensor([row.ids])
        with torch.no_grad():
            guess = model(input_ids=x).logits[0].argmax(-1)
        a = row.answer_from
        shares.append(float((guess[a - 1 : len(row.ids) - 1] == x[0, a:]).float().mean()))
    return {
        "copy_first_half_loss": float(loss[:, :127].mean()),
        "copy_repeat_loss": float(loss[:, 130:].mean()),
        "niah_single_1_answer_token_accuracy": sum(shares) / len(shares),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arm", choices=sorted(RECIPES))
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--wide", action="store_true", help="the default model's width and depth, tiny GDN layers")
    parser.add_argument("--init-from", default=None, metavar="RUN", help="start from another arm's run folder")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: %(default)s)")
    parser.add_argument("--out", default=None, help="run folder (default: /tmp/recipe-ARM; replaced)")
    parser.add_argument("--tokenizer", default=None, help="the hybrid's tokenizer.json (default: learn one, ~10 s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # two arms side by side on a 2-core machine
    out = Path(args.out or f"/tmp/recipe-{args.arm}")
    shutil.rmtree(out, ignore_errors=True)
    eval_lens = tuple(sorted({256, max(256, RECIPES[args.arm].seq_lens[-1])}))  # 256, and the arm's longest rows
    cfg = TrainConfig(steps=args.steps, warmup_steps=min(30, args.steps - 1), lr=args.lr, log_every=20, eval_every=100,
                      checkpoint_every=10**6, eval_per_task=8, eval_lens=eval_lens,
                      micro_batch_tokens=4096)  # fmt: skip
    model = WIDE_MODEL if args.wide else MODEL
    train(out / "run", RunConfig(model, RECIPES[args.arm], cfg), device="cpu", tokenizer=args.tokenizer,
          init_from=args.init_from)  # fmt: skip
    tokenizer = load_trained(out / "run" / "tokenizer.json")  # the one given, or the one the run learnt
    result = {"arm": args.arm, "steps": args.steps, **probe(out / "run" / "model", tokenizer)}
    (out / "probe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
