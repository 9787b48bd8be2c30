"""Typed training configuration: four sections (target, data, drafter, train), every field documented.

Loaded from JSON or YAML with a strict loader: unknown keys, wrong types and bad choices are
`BadInput` errors naming the file and the key. `eagle3 train --explain` prints every field with
its default and documentation. Overrides from the command line use dotted keys
(`--set train.lr=5e-5`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput


def doc(
    text: str, default: Any = dataclasses.MISSING, choices: tuple | None = None, **kw: Any
) -> Any:
    """A dataclass field carrying its documentation (and allowed values) in metadata."""
    meta = {"doc": text, "choices": choices}
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass
class TargetSection:
    path: str = doc(
        "directory of the target model: config.json and *.safetensors (with or without an index)",
        "",
    )
    lm_head_key: str = doc(
        "safetensors key of the target lm_head [vocab, hidden] (Kimi-K2.5: "
        "language_model.lm_head.weight)",
        "lm_head.weight",
    )
    embed_key: str = doc(
        "safetensors key of the target input embedding [vocab, hidden] (Kimi-K2.5: "
        "language_model.model.embed_tokens.weight); the drafter keeps it frozen",
        "model.embed_tokens.weight",
    )


@dataclass
class DataSection:
    dump: str = doc("hidden-state dump directory (meta.json + shards/, see dense.py)", "")
    dataset: str = doc(
        "tokenized dataset JSONL (with its .index.json) that the dump was made from", ""
    )
    vocab: str | None = doc(
        "draft vocabulary mapping vocab.safetensors (d2t/t2d); null = full target vocabulary", None
    )
    max_tokens: int = doc(
        "token budget of one packed sequence per rank and step (samples packed with document masks)",
        4096,
    )
    max_len: int | None = doc(
        "truncate samples to this many tokens; null = max_tokens (with long_samples: alone, "
        "null = no truncation)",
        None,
    )
    long_samples: str = doc(
        "samples longer than max_tokens: truncate (to max_tokens) or alone (each is one step of "
        "its own length, up to max_len; short samples still pack to max_tokens)",
        "truncate",
        choices=("truncate", "alone"),
    )
    pack_window: int = doc(
        "first-fit packing looks this many samples ahead (deterministic); 1 = sequential", 64
    )
    prefetch: int = doc("batches prepared ahead by the loader thread", 4)
    pin_memory: bool = doc("pin host batches for asynchronous copies (CUDA only)", True)
    holdout_fraction: float = doc(
        "fraction of sample ids (by hash) kept out of training for evaluation", 0.0
    )


@dataclass
class DrafterSection:
    arch: str = doc(
        "llama = SGLang LlamaForCausalLMEagle3; mla = Eagle3DeepseekV2ForCausalLM (kimi_k25_eagle3.py)",
        "llama",
        choices=("llama", "mla"),
    )
    hidden_size: int | None = doc(
        "drafter hidden size; null = the target's (required for SGLang to share the embedding)",
        None,
    )
    num_attention_heads: int = doc("attention heads", 32)
    num_key_value_heads: int | None = doc("llama: KV heads (GQA); null = num_attention_heads", None)
    head_dim: int | None = doc("llama: head dimension; null = hidden_size // heads", None)
    intermediate_size: int | None = doc("MLP width; null = 8/3 x hidden rounded up to 64", None)
    rms_norm_eps: float = doc("RMSNorm epsilon", 1e-5)
    rope_theta: float = doc(
        "RoPE base; the drafter trains and serves plain RoPE (rope_scaling null), never the "
        "target's YaRN",
        10000.0,
    )
    max_position_embeddings: int | None = doc(
        "context length written to config.json; null = the target's (SGLang refuses a drafter "
        "shorter than its target)",
        None,
    )
    q_lora_rank: int = doc("mla: query low-rank dimension", 1536)
    kv_lora_rank: int = doc("mla: compressed KV dimension", 512)
    qk_nope_head_dim: int = doc("mla: per-head non-rotary query/key dimension", 128)
    qk_rope_head_dim: int = doc("mla: per-head rotary query/key dimension", 64)
    v_head_dim: int = doc("mla: per-head value dimension", 128)
    fc_norm: bool = doc("EAGLE-3.1: RMSNorm each aux chunk before fc (SGLang fc_norm)", False)
    norm_output: bool = doc(
        "SGLang meaning: feed the post-norm hidden state to the next draft step (default pre-norm)",
        False,
    )
    init_std: float = doc("normal init std of the trained linear layers", 0.02)
    init_lm_head_from_target: bool = doc(
        "initialise lm_head with the target lm_head rows of the draft vocabulary", True
    )
    aux_layer_ids: list[int] | None = doc(
        "capture layers (input-of-layer convention); null = the dump's resolved ids", None
    )


@dataclass
class TrainSection:
    out_dir: str = doc("run directory: checkpoints/, metrics.jsonl, config.json", "runs/drafter")
    seed: int = doc("seed for init, data order and noise", 0)
    epochs: int = doc("passes over the training samples", 1)
    max_steps: int | None = doc("stop after this many optimizer steps (null = epochs)", None)
    lr: float = doc("peak learning rate (AdamW)", 1e-4)
    min_lr_ratio: float = doc("cosine floor as a fraction of lr", 0.0)
    warmup_steps: int | None = doc("linear warmup steps; null = warmup_ratio x total steps", None)
    warmup_ratio: float = doc("warmup as a fraction of the total steps", 0.015)
    weight_decay: float = doc("AdamW weight decay", 0.0)
    betas: list[float] = doc("AdamW betas", [0.9, 0.95])
    adam_eps: float = doc("AdamW epsilon", 1e-8)
    grad_clip: float = doc("clip the global gradient norm to this (0 = off)", 0.5)
    max_nonfinite_steps: int = doc(
        "a step whose gradient norm is NaN/inf is skipped (no update, weights stay finite); "
        "more skipped steps than this stop the run before its next save (0 = at the first)",
        8,
    )
    ttt_steps: int = doc("training-time-test unroll length", 7)
    step_weight: float = doc("loss weight of TTT step k is step_weight**k", 0.8)
    noise_std: float = doc(
        "Gaussian noise on aux hidden states, relative to each token's RMS (0 = off)", 0.0
    )
    precision: str = doc(
        "auto = bf16 autocast on CUDA, fp32 on CPU; master weights are always fp32",
        "auto",
        choices=("auto", "bf16", "fp32"),
    )
    device: str = doc("auto | cpu | cuda", "auto", choices=("auto", "cpu", "cuda"))
    attention: str = doc(
        "TTT attention kernel: flex (CUDA), chunked (memory-efficient torch), dense (reference)",
        "auto",
        choices=("auto", "flex", "chunked", "dense"),
    )
    compile: bool = doc("torch.compile the layer on CUDA (flex attention is always compiled)", True)
    parallel: str = doc(
        "ddp (replicated drafter) or fsdp (sharded; for drafters that do not fit one GPU)",
        "ddp",
        choices=("ddp", "fsdp"),
    )
    sequence_parallel: bool = doc(
        "under torchrun: every rank trains the same packed batch, each its contiguous share of "
        "the positions (any rank count; gradients summed over ranks: exactly the one-rank step); "
        "for samples too long for one GPU. Chunked attention, no idle-row skipping, not with "
        "parallel: fsdp",
        False,
    )
    skip_idle_rows: bool = doc(
        "run TTT steps >= 1 and the draft lm_head only at positions with loss (or counted by the "
        "simulated acceptance); exact: same loss, gradients and metrics, less compute on prompts",
        True,
    )
    teacher_chunk: int = doc("rows per chunk of the full-vocabulary teacher logits", 1024)
    loss_chunk: int = doc("rows per chunk of the draft-vocabulary soft cross-entropy", 2048)
    loss_recompute: bool = doc(
        "no effect (kept so that older configs load): the soft CE is fused with the draft "
        "lm_head and keeps no [T, draft vocab] tensor and no teacher for backward, always",
        False,
    )
    checkpoint_ttt_steps: bool = doc(
        "long sequences: activation checkpointing per TTT step (exact; recomputes each step's "
        "layer in backward)",
        False,
    )
    cast_weights_once: bool | None = doc(
        "bf16: the layer's matrices are cast once per step and shared by the TTT steps instead "
        "of a saved copy per TTT step (exact: gradients still sum in fp32; ~1.4 GiB per TTT step "
        "less at the Kimi shape); null = on, except with parallel: fsdp across ranks (true "
        "there is an error)",
        None,
    )
    recompute_elementwise: bool = doc(
        "the fp32 TTT-diagonal merge and the RMSNorm before the draft lm_head keep only their "
        "inputs and are recomputed in backward (exact; elementwise work only)",
        True,
    )
    compile_loss: bool = doc(
        "the soft CE's per-chunk fp32 math (log-sum-exp, CE, argmax, logit gradient) as "
        "torch.compile'd fused kernels instead of a dozen eager passes (same math; falls back "
        "to eager if it cannot compile); applied where the layer is compiled (CUDA, "
        "train.compile)",
        True,
    )
    embed_once: bool = doc(
        "the embedding half of the layer's input projections (q/k/v; MLA: q_a, kv_a) computed "
        "once per unroll over the L + ttt_steps rows instead of once per TTT step (every step's "
        "embeddings are shifted rows of one sequence): the same sums, 12 % fewer FLOPs at the "
        "Kimi shape; within bf16 rounding (the two halves are rounded before their sum)",
        True,
    )
    shard_tokens: int = doc(
        "a batch longer than this trains in query shards of this many positions, one after "
        "another against the step-0 keys and values of all positions (exact: the same loss and "
        "gradients; activation memory of one shard, so 128K-token samples fit one GPU); one "
        "process only (not DDP/FSDP: use sequence_parallel there); a multiple of 128; 0 = off",
        16384,
    )
    embed_on_host: bool | None = doc(
        "the frozen target embedding stays in host memory and the loader gathers each batch's "
        "rows (one [L + ttt_steps, H] tensor per batch, every TTT step a view of it: exact, the "
        "same rows; 2.2 GiB less GPU memory at the Kimi shape); null = on where the embedding is "
        "frozen, the data is a dump (not --online) and parallel is not fsdp",
        None,
    )
    lm_head_on_host: bool | None = doc(
        "the target lm_head (the teacher's; 2.19 GiB at the Kimi shape) waits in pinned host "
        "memory between teachers: dropped from the GPU after the step's teacher, uploaded again "
        "on a side stream while backward runs (exact: the same bytes); null = on with CUDA "
        "except under sequence_parallel",
        None,
    )
    teacher_fp32: bool = doc("compute teacher logits in fp32 (slower; bf16 matches serving)", False)
    log_every: int = doc("emit a metrics line every N steps", 10)
    save_every: int = doc("checkpoint every N steps (0 = only at the end)", 500)
    keep_last: int = doc("checkpoints kept (newest first)", 2)
    keep_every: int = doc("also keep checkpoints whose step is a multiple of this (0 = none)", 0)
    sim_steps: int = doc("serving config for the simulated acceptance: speculative steps", 3)
    sim_topk: int = doc("serving config: eagle topk (chain drafting supports 1)", 1)
    sim_draft_tokens: int = doc("serving config: speculative draft tokens", 4)
    resume: str = doc("auto = continue from out_dir's newest checkpoint; never; or a path", "auto")
    stop_after_step: int | None = doc(
        "testing: checkpoint after this step and exit as if killed", None
    )


@dataclass
class OnlineSection:
    """Online training (remote_agent/eagle3/online/): hidden states streamed from a producer
    instead of read from data.dump."""

    server: str | None = doc(
        "producer to request samples from: the patched SGLang server (EAGLE3_DUMP_MODE=stream) "
        "or `eagle3 stream-reference`, http://HOST:PORT; null = offline (data.dump)",
        None,
    )
    listen: str | None = doc(
        "stream address the trainer listens on (the producer's EAGLE3_STREAM_ADDR): "
        "unix:PATH or tcp:HOST:PORT; null = unix:<train.out_dir>/stream.sock",
        None,
    )
    rid_prefix: str = doc("rid prefix the hook dumps (EAGLE3_DUMP_RID_PREFIX)", "dump-")
    window: int = doc(
        "samples requested ahead of training (in flight + received, held in host memory); the "
        "order itself is the offline one: a seeded global shuffle of the sample ids",
        64,
    )
    request_batch: int = doc("samples per /generate request", 8)
    concurrency: int = doc("/generate requests in flight", 4)
    sample_timeout_s: float = doc("ask again for a sample not received within this", 300.0)
    producer_wait_s: float = doc(
        "give up (a clear error, resumable) after this long without any sample arriving", 900.0
    )
    cache_dir: str | None = doc(
        "bounded disk cache (a ring, oldest evicted) that later epochs read; null = none", None
    )
    cache_gb: float = doc("size of the disk cache ring in GB (0 = no cache)", 0.0)
    compare_reforwards: bool = doc(
        "digest every sample's rows and count, among samples streamed again (later epochs), "
        "those whose rows differ from their first arrival's (online-stats.json `reforwards`); "
        "a measurement (bench_online.py): hashing costs the listener ~1 s per GB",
        False,
    )


@dataclass
class Config:
    target: TargetSection = field(default_factory=TargetSection)
    data: DataSection = field(default_factory=DataSection)
    drafter: DrafterSection = field(default_factory=DrafterSection)
    train: TrainSection = field(default_factory=TrainSection)
    online: OnlineSection = field(default_factory=OnlineSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# strict loading


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_type_ok(v, item) for v in value)
    return True


def _coerce(value: Any, tp: Any) -> Any:
    """ints where floats are declared become floats (1 -> 1.0); lists stay lists."""
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _build_section(cls: type, data: Any, where: str, source: str) -> Any:
    if not isinstance(data, dict):
        raise BadInput(f"{source}: '{where}' must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise BadInput(
                f"{source}: unknown key '{where}.{key}'{hint}; known: {', '.join(fields)}"
            )
        tp = hints[key]
        if not _type_ok(value, tp):
            raise BadInput(f"{source}: '{where}.{key}' must be {_type_name(tp)}, got {value!r}")
        choices = fields[key].metadata.get("choices")
        if choices and value not in choices:
            raise BadInput(
                f"{source}: '{where}.{key}' must be one of {', '.join(choices)}, got {value!r}"
            )
        kwargs[key] = _coerce(value, tp)
    return cls(**kwargs)


SECTIONS = {
    "target": TargetSection,
    "data": DataSection,
    "drafter": DrafterSection,
    "train": TrainSection,
    "online": OnlineSection,
}


def from_dict(data: Any, source: str = "<config>") -> Config:
    if not isinstance(data, dict):
        raise BadInput(
            f"{source}: the config must be a mapping with sections {', '.join(SECTIONS)}"
        )
    for key in data:
        if key not in SECTIONS:
            close = difflib.get_close_matches(str(key), list(SECTIONS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise BadInput(f"{source}: unknown section '{key}'{hint}; known: {', '.join(SECTIONS)}")
    return Config(
        **{
            name: _build_section(cls, data.get(name, {}), name, source)
            for name, cls in SECTIONS.items()
        }
    )


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"  # drafter/examples/


def resolve_config_path(path: Path) -> Path:
    """A config file, or the name of a shipped example (`tiny-cpu`, `tiny-gpu`, `kimi-k25-8gpu`),
    so a runbook can name a config that exists wherever the agent runs."""
    path = Path(path)
    if path.exists() or path.parent != Path("."):
        return path
    example = EXAMPLES / f"{path.name.removesuffix('.yaml')}.yaml"
    return example if example.exists() else path


def read_file(path: Path) -> dict[str, Any]:
    path = resolve_config_path(path)
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in EXAMPLES.glob("*.yaml")))
        raise BadInput(f"{path}: no such config file (shipped examples: {known})")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # comes with transformers
        except ImportError:
            raise BadInput(f"{path}: YAML needs PyYAML; write the config as JSON instead") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise BadInput(f"{path}{line}: not valid YAML ({exc})") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BadInput(f"{path}: not valid JSON ({exc})") from None
    return data if data is not None else {}


def parse_override(item: str) -> tuple[list[str], Any]:
    """`section.key=value`; value parsed as JSON when it parses (numbers, true, null, lists)."""
    if "=" not in item:
        raise BadInput(f"--set {item!r}: expected section.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) != 2:
        raise BadInput(f"--set {item!r}: the key must be section.key (e.g. train.lr)")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = json.loads(json.dumps(data))  # deep copy
    for item in overrides:
        (section, key), value = parse_override(item)
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise BadInput(f"--set {item!r}: section '{section}' is not a mapping")
        data[section][key] = value
    return data


def load(path: Path | None, overrides: list[str] | None = None) -> Config:
    data = read_file(path) if path is not None else {}
    source = str(path) if path is not None else "<defaults>"
    if overrides:
        data = apply_overrides(data, overrides)
    return from_dict(data, source)


def explain() -> str:
    """Every field with its type, default and documentation (for `eagle3 train --explain`)."""
    lines = []
    for name, cls in SECTIONS.items():
        lines.append(f"{name}:")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            # every field has a default or a factory (MISSING is not callable to the checker)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # pyright: ignore[reportCallIssue]
            lines.append(f"  {f.name}: {json.dumps(default)}    # {_type_name(hints[f.name])}")
            lines.append(f"      {f.metadata.get('doc', '')}")
    return "\n".join(lines)
