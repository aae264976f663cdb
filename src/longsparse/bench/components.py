"""Where a forward pass spends its time: device time of named regions, summed into the components of a prefill.

Regions are opened and closed by forward hooks (PyTorch's public ``register_forward_pre_hook`` /
``register_forward_hook``) on the modules both transformers' models and ours are made of, so the same split applies
to both:

* ``linear``: every ``nn.Linear`` outside an MLP (``lm_head`` included); those inside a token mixer are also
  counted as ``attention_linear`` / ``gdn_linear`` so that they can be taken out of the mixer's time;
* ``mlp``: each gated MLP as a whole;
* ``attention_mixer`` / ``gdn_mixer``: each attention / Gated DeltaNet module as a whole;
* ``selection`` (ours only): the block choice of the ``sparse`` / ``sparda`` attention layers and the Forecast
  projections, timed by instrumented twins of our own backends and emitters (:func:`instrument`);
* ``gdn_kernel`` (ours only): the chunked recurrence inside each GDN layer (its core object wrapped the same way),
  reported beside the split: ``gdn_core`` minus it is the convolution, gates and gated norm.

:func:`components` turns the region totals into the reported split; CUDA events time regions on a GPU (no
synchronisation inside the pass), the wall clock elsewhere.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch
from torch import nn

from ..models.layers import Attention, GatedDeltaNet, GatedMLP
from ..models.sparse_attention import ForecastEmitter, SpardaAttention, SparseAttention

COMPONENTS = ("projections_mlp", "attention", "selection", "gdn_core", "other")
"""The reported split, in stacking order. ``attention`` is the attention module minus its projections and the
selection (RoPE, q/k norms, output gate and KV-cache writes included); ``gdn_core`` is the GDN module minus its
projections (causal conv, gates and gated norm included); ``other`` is the rest of the pass (embeddings, layer norms,
residual adds)."""


class ComponentClock:
    """Device time of named regions over one or more passes. ``region(name)`` is a context manager; ``totals_ms()``
    waits for the device and returns ``{name: milliseconds}`` summed over every time the region ran."""

    def __init__(self, device: torch.device):
        self.device = device
        self._events: list[tuple[str, object, object]] = []
        self._cpu_ms: dict[str, float] = defaultdict(float)
        self._open: dict[str, list] = defaultdict(list)

    def start(self, name: str) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        else:
            event = time.perf_counter()
        self._open[name].append(event)

    def stop(self, name: str) -> None:
        begin = self._open[name].pop()
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((name, begin, end))
        else:
            self._cpu_ms[name] += (time.perf_counter() - begin) * 1e3

    @contextlib.contextmanager
    def region(self, name: str):
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)

    def totals_ms(self) -> dict[str, float]:
        if any(self._open.values()):
            raise ValueError(f"regions still open: {sorted(n for n, v in self._open.items() if v)}")
        totals = defaultdict(float, self._cpu_ms)
        if self._events:
            torch.cuda.synchronize(self.device)
        for name, begin, end in self._events:
            totals[name] += begin.elapsed_time(end)
        return dict(totals)


def components(raw_ms: dict[str, float], total_ms: float) -> dict[str, float]:
    """The split of :data:`COMPONENTS` (milliseconds) from region totals ``raw_ms`` and the whole pass ``total_ms``."""
    get = lambda name: raw_ms.get(name, 0.0)  # noqa: E731
    selection = get("selection")
    split = {
        "projections_mlp": get("linear") + get("mlp"),
        "attention": get("attention_mixer") - get("attention_linear") - selection,
        "selection": selection,
        "gdn_core": get("gdn_mixer") - get("gdn_linear"),
    }
    split["other"] = total_ms - sum(split.values())
    return split


def shares(split: dict[str, float]) -> dict[str, float]:
    """Each component's fraction of the total of ``split``."""
    total = sum(split.values())
    return {k: (v / total if total > 0 else float("nan")) for k, v in split.items()}


def _mixer_kind(module: nn.Module) -> str | None:
    """``"attention"`` / ``"gdn"`` for a token mixer of ours or of transformers (by class name: ``*GatedDeltaNet``,
    ``*Attention`` with a ``q_proj``), else None."""
    name = type(module).__name__
    if isinstance(module, GatedDeltaNet) or name.endswith("GatedDeltaNet"):
        return "gdn"
    if isinstance(module, Attention) or (name.endswith("Attention") and hasattr(module, "q_proj")):
        return "attention"
    return None


def _is_mlp(module: nn.Module) -> bool:
    return isinstance(module, GatedMLP) or type(module).__name__.endswith("MLP")


def regions_of(model: nn.Module) -> list[tuple[nn.Module, tuple[str, ...]]]:
    """``(module, region names)`` for every module of ``model`` that opens regions (see the module docstring)."""
    found: list[tuple[nn.Module, tuple[str, ...]]] = []

    def walk(module: nn.Module, mixer: str | None, in_mlp: bool) -> None:
        for child in module.children():
            kind = _mixer_kind(child)
            if kind is not None:
                found.append((child, (f"{kind}_mixer",)))
                walk(child, kind, in_mlp)
            elif _is_mlp(child) and not in_mlp:
                found.append((child, ("mlp",)))
                walk(child, mixer, True)
            elif isinstance(child, nn.Linear):
                if not in_mlp:
                    found.append((child, ("linear",) + ((f"{mixer}_linear",) if mixer else ())))
            else:
                walk(child, mixer, in_mlp)

    walk(model, None, False)
    return found


class _TimedSparse(SparseAttention):
    """InfLLM-V2 attention whose block choice is a ``selection`` region."""

    def __init__(self, inner: SparseAttention, clock: ComponentClock):
        super().__init__(inner.config, inner.use_kernel)
        self.clock = clock

    def select_prefill(self, *args):
        with self.clock.region("selection"):
            return super().select_prefill(*args)


class _TimedSparda(SpardaAttention):
    """SparDA attention whose block choice is a ``selection`` region."""

    def __init__(self, inner: SpardaAttention, clock: ComponentClock):
        super().__init__(inner.config, inner.use_kernel)
        self.clock = clock

    def select_prefill(self, *args):
        with self.clock.region("selection"):
            return super().select_prefill(*args)


class _TimedGDNCore:
    """A GDN layer's core (dense or sparse chunked recurrence) whose calls are a ``gdn_kernel`` region: what of the
    ``gdn_core`` component is the recurrence, and what the convolution, gates and norm around it."""

    def __init__(self, inner, clock: ComponentClock):
        self.inner, self.clock = inner, clock

    def __getattr__(self, name):  # mode, kernel, config …: the wrapped core's
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        with self.clock.region("gdn_kernel"):
            return self.inner(*args, **kwargs)


class _TimedForecast:
    """A :class:`ForecastEmitter` whose projection (and, in decode, block choice) is a ``selection`` region."""

    def __init__(self, inner: ForecastEmitter, clock: ComponentClock):
        self.inner, self.clock = inner, clock

    def __call__(self, *args) -> None:
        with self.clock.region("selection"):
            self.inner(*args)


@contextlib.contextmanager
def instrument(model: nn.Module, clock: ComponentClock):
    """Within the block, ``model``'s forward passes record their regions in ``clock``; afterwards the hooks are
    removed and our attention layers get their own backends and Forecast emitters back."""
    handles = []
    for module, names in regions_of(model):

        def pre(_module, _args, names=names):
            for name in names:
                clock.start(name)

        def post(_module, _args, _out, names=names):
            for name in reversed(names):
                clock.stop(name)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    swapped, cores = [], []
    for module in model.modules():
        if isinstance(module, GatedDeltaNet):
            cores.append((module, module.core))
            module.core = _TimedGDNCore(module.core, clock)
        if not isinstance(module, Attention):
            continue
        swapped.append((module, module.backend, module.forecasters))
        if isinstance(module.backend, SpardaAttention):
            module.backend = _TimedSparda(module.backend, clock)
        elif isinstance(module.backend, SparseAttention):
            module.backend = _TimedSparse(module.backend, clock)
        module.forecasters = [_TimedForecast(f, clock) for f in module.forecasters]
    try:
        yield clock
    finally:
        for handle in handles:
            handle.remove()
        for module, backend, forecasters in swapped:
            module.backend, module.forecasters = backend, forecasters
        for module, core in cores:
            module.core = core


def breakdown(model: nn.Module, run, device: torch.device) -> dict[str, float]:
    """Run ``run()`` (one forward pass of ``model``) instrumented; the split of :data:`COMPONENTS` in ms, plus
    ``total`` (the instrumented pass, hooks included)."""
    clock = ComponentClock(device)
    with instrument(model, clock):
        with clock.region("total"):
            out = run()
        raw = clock.totals_ms()
    del out
    split = components(raw, raw["total"])
    split["total"] = raw["total"]
    if "gdn_kernel" in raw:  # our GDN layers only (transformers' recurrence is a function call, not a module)
        split["gdn_kernel"] = raw["gdn_kernel"]
    return split
