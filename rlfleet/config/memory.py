"""Where a GPU run's memory goes, decided before anything starts: vLLM's share of a GPU it shares
with the trainer, whether vLLM sleeps while the trainer steps, the trainer's activation
checkpointing and optimizer offload, and the micro-batch that leaves.

Estimates from the model's config (config/sizing.py `ModelShape`), on the safe side; the trainer's
first-batch probe (trainer/budget.py) measures and confirms them, sizing the micro-batch from the
memory it finds free under the checkpointing chosen here (one step further only if a row does not
fit). Checked against the probe's own lines: Qwen2-0.5B's and -1.5B's bodies with a 32k vocabulary
measured 1.126 and 1.124 MiB a token without checkpointing (benchmarks/results/
trainer_in_loop_h100_05b.json, vs_trl_h200x2_05b_mbs8_fa4_steps.log); `step_bytes` says 1.03 and
1.62: near, and above where it errs by much (tests/test_memory_plan.py).

The order tried, fastest first (`plan`): vLLM awake beside the trainer with KV for every sequence in
flight; then with KV for at most `MIN_SEQS` of the longest; then vLLM asleep while the trainer
steps (on-policy jobs only: it frees everything but its CUDA context); last, KV for one rollout;
then each of those again with the optimizer offloaded to the host. Within each, the trainer's checkpointing goes none, selective,
full. The first that fits is the plan; none fitting is refused, naming each lever that would fit.
A lever the user set is kept as set.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from rlfleet.config.sizing import GIB, ModelShape

Mode = Literal["none", "selective", "full"]
MODES: tuple[Mode, ...] = ("none", "selective", "full")

VLLM_FIXED = 4 * GIB  # vLLM besides weights and KV: CUDA context and graphs, activations, sampler, workspaces
VLLM_ASLEEP = 1 * GIB  # vLLM asleep (level 2: weights and KV freed): its CUDA context and graphs
TRAINER_FIXED = 2 * GIB  # the trainer's CUDA context, compile workspaces, allocator slack
MIN_SEQS = 4  # the fewest longest rollouts vLLM's KV cache holds at once before rollouts serialize
SHARE_CAP = 0.9  # vLLM's most of any GPU (its own default)
HEAD_ELEMENTS = 1 << 29  # the LM head's chunk x vocabulary: 2 GiB of fp32 logits a chunk


def head_chunk(vocab: int) -> int:
    """Tokens a chunk of the LM head (trainer.lm_head_chunk unset, on a GPU): 8192 up to a 64k
    vocabulary, halved until a chunk's fp32 logits stay 2 GiB (Qwen3's 152k: 2048), at least 1024."""
    chunk = 8192
    while chunk > 1024 and chunk * vocab > HEAD_ELEMENTS:
        chunk //= 2
    return chunk


@dataclass(frozen=True)
class Job:
    """What the plan reads of a run: the model, its rows and rollouts, its precision and placement."""

    shape: ModelShape
    row_tokens: int  # one packed row (orchestrator.seq_len): the smallest micro-batch
    max_model_len: int
    in_flight: int  # sequences the rollout stream keeps in flight on one replica
    stored_bytes: int = 2  # model.dtype: weights, gradients and AdamW's moments
    compute_bytes: int = 2  # trainer.param_dtype
    vllm_bytes: int = 2  # inference.dtype: vLLM's KV cache and activations
    vllm_weight_bytes: int = 0  # vLLM's weights when quantized (fp8: 1); 0: vllm_bytes
    trains_all: bool = True  # False: LoRA on a frozen base
    ranks: int = 1  # trainer ranks the state shards over
    tp: int = 1  # vLLM's tensor parallelism
    transport_copies: int = 0  # copies of the weights the transport keeps on the trainer's GPU
    lm_head_chunk: int | None = None
    on_policy: bool = True  # max_async_level 0: vLLM may sleep while the trainer steps


@dataclass(frozen=True)
class Levers:
    """One choice of the levers; None where the user left it to the plan."""

    checkpointing: Mode | None = None
    offload: bool | None = None
    sleep: bool | None = None
    vllm_share: float | None = None


@dataclass(frozen=True)
class MemoryPlan:
    """What was decided and the estimates behind it (the flow logs `line()`)."""

    gpu_bytes: int
    shared: bool  # vLLM and a trainer rank on one GPU
    checkpointing: Mode
    offload: bool
    sleep: bool
    vllm_share: float  # vLLM's gpu_memory_utilization
    kv_seqs: float  # longest rollouts vLLM's KV cache holds at that share
    trainer_bytes: int  # the trainer's estimated peak with one row
    row_bytes: int  # of which one row's activations and LM-head chunk (the probe's "GiB a row")
    micro_batch_tokens: int  # tokens a micro-batch could hold by the estimate (the probe sizes it)
    why: str

    def line(self) -> str:
        vllm = f"vLLM {self.vllm_share:.2f} of the GPU (KV for {self.kv_seqs:.1f} of the longest rollouts)"
        if self.sleep:
            vllm += ", asleep while the trainer steps"
        return (
            f"{vllm}; trainer: activation checkpointing {self.checkpointing}, optimizer "
            f"{'offloaded to the host' if self.offload else 'on the GPU'}, ~{self.trainer_bytes / GIB:.1f} GiB "
            f"with one row (~{self.row_bytes / GIB:.2f} GiB of it the row), micro-batches up to "
            f"~{self.micro_batch_tokens} tokens (sized at the first batch) of {self.gpu_bytes / GIB:.1f} GiB: "
            f"{self.why}"
        )


def kv_token_bytes(job: Job) -> int:
    """KV cache bytes a token takes on one vLLM GPU: K and V of every layer's KV heads."""
    s = job.shape
    heads = s.kv_heads or s.heads
    width = heads * (s.head_dim or s.hidden // max(1, s.heads)) if heads else s.hidden
    return -(-2 * s.layers * width * job.vllm_bytes // job.tp)


def vllm_bytes(job: Job, seqs: float) -> int:
    """vLLM awake with KV for `seqs` of the longest rollouts."""
    weights = job.shape.params * (job.vllm_weight_bytes or job.vllm_bytes) // job.tp
    return weights + VLLM_FIXED + int(seqs * job.max_model_len * kv_token_bytes(job))


def static_bytes(job: Job, offload: bool) -> int:
    """The trainer's GPU between steps: its shard of the weights and, when every weight trains,
    their gradients and AdamW's two moments (offloaded: two layers gathered in the compute dtype), and
    the weight transport's copies in vLLM's dtype."""
    s = job.shape
    if offload:
        state = 2 * -(-job.shape.params * job.compute_bytes // max(1, s.layers))
    else:
        state = job.shape.params * job.stored_bytes * (4 if job.trains_all else 1) // job.ranks
    return state + job.transport_copies * job.shape.params * job.vllm_bytes + TRAINER_FIXED


def token_bytes(job: Job, mode: Mode) -> int:
    """Activation bytes a token keeps across the decoder layers until backward. Without
    checkpointing 2 x (hidden + intermediate) values a layer (the probe's calibration, module
    docstring); selective keeps half; full keeps each layer's input."""
    s = job.shape
    per_layer = {"none": 2 * (s.hidden + s.ffn), "selective": s.hidden + s.ffn, "full": s.hidden}[mode]
    return s.layers * per_layer * job.compute_bytes


def step_bytes(job: Job, mode: Mode, offload: bool, tokens: int) -> int:
    """The trainer's estimated peak in a step of `tokens` a micro-batch: its state, the layers'
    activations, full checkpointing's one recomputed layer, and the LM head's chunk of fp32 logits
    (four copies: logits, softmax, their gradient, the probe's 16 bytes a vocabulary entry)."""
    s = job.shape
    chunk = min(tokens, job.lm_head_chunk or head_chunk(s.vocab))
    recompute = tokens * 2 * (s.hidden + s.ffn) * job.compute_bytes if mode == "full" else 0
    head = chunk * s.vocab * 16
    return static_bytes(job, offload) + tokens * token_bytes(job, mode) + recompute + head


def most_tokens(job: Job, mode: Mode, offload: bool, budget: int) -> int:
    """The most tokens a micro-batch holds in `budget` by `step_bytes` (0: not one)."""
    lo, hi = 0, 1 << 24
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if step_bytes(job, mode, offload, mid) <= budget else (lo, mid - 1)
    return lo


def plan(job: Job, gpu_bytes: int, shared: bool, fixed: Levers = Levers()) -> MemoryPlan | None:
    """The first choice that fits, in the module docstring's order; None if none does."""
    offloads = [fixed.offload] if fixed.offload is not None else [False, True]
    modes = [fixed.checkpointing] if fixed.checkpointing is not None else list(MODES)
    if not shared:  # vLLM on its own GPU: its share as set or 0.9; the trainer has its GPU to itself
        share = fixed.vllm_share or SHARE_CAP
        if vllm_bytes(job, 1) > share * gpu_bytes:
            return None
        for offload in offloads:
            for mode in modes:
                if (peak := step_bytes(job, mode, offload, job.row_tokens)) <= gpu_bytes:
                    return _made(
                        job,
                        gpu_bytes,
                        False,
                        mode,
                        offload,
                        False,
                        share,
                        peak,
                        gpu_bytes,
                        "vLLM on its own GPU",
                    )
        return None
    sleeps = [fixed.sleep] if fixed.sleep is not None else [False, True] if job.on_policy else [False]
    for offload in offloads:
        for sleep, seqs, mode in _order(job, sleeps, modes):
            if found := _shared(job, gpu_bytes, mode, offload, sleep, seqs, fixed.vllm_share):
                return found
    return None


def _order(job: Job, sleeps: list[bool], modes: list[Mode]) -> list[tuple[bool, float, Mode]]:
    """Shared-GPU candidates (sleep, KV sequences, checkpointing), cheapest first: recomputing less
    beats waking vLLM each step (a reload), which beats recomputing every layer (~1/3 more compute)."""
    awake = [(False, float(job.in_flight)), (False, float(MIN_SEQS))] if False in sleeps else []
    asleep = [(True, float(MIN_SEQS))] if True in sleeps else []
    light = [m for m in modes if m != "full"]
    order = [(s, q, m) for m in light for s, q in awake] + [(s, q, m) for m in light for s, q in asleep]
    order += [(s, q, "full") for s, q in awake + asleep if "full" in modes]
    return order + [(False, 1.0, m) for m in modes if awake]  # last: rollouts one at a time


def _shared(
    job: Job, total: int, mode: Mode, offload: bool, sleep: bool, seqs: float, share: float | None
) -> MemoryPlan | None:
    """One candidate on a shared GPU: vLLM awake needs KV for `seqs` beside the trainer's peak (or,
    asleep, beside its state between steps, and the trainer's peak beside vLLM asleep)."""
    seqs = min(seqs, max(job.in_flight, 1))
    peak = step_bytes(job, mode, offload, job.row_tokens)
    beside = static_bytes(job, offload) if sleep else peak  # the trainer while vLLM is awake
    if sleep and peak + VLLM_ASLEEP > total:
        return None
    if share is None:
        if vllm_bytes(job, seqs) > total - beside:
            return None
        if seqs >= job.in_flight and not sleep:  # what it needs, rounded up; the trainer the rest
            share = min(SHARE_CAP, -(-vllm_bytes(job, seqs) * 100 // total) / 100)
        else:  # all the trainer leaves it, rounded down
            share = min(SHARE_CAP, int((total - beside) * 100 / total) / 100)
        if share * total + beside > total:
            return None
    elif vllm_bytes(job, 1) > share * total or share * total + beside > total:
        return None
    room = total - (VLLM_ASLEEP if sleep else int(share * total))
    if sleep:
        why = "the trainer fits only while vLLM sleeps"
    elif seqs >= job.in_flight:
        why = f"KV for all {job.in_flight} rollouts in flight fits beside the trainer"
    else:
        why = f"KV for all {job.in_flight} rollouts in flight does not fit beside the trainer: vLLM takes the rest"
    if offload:
        why += "; the optimizer's state on the host"
    return _made(job, total, True, mode, offload, sleep, share, peak, room, why)


def _made(
    job: Job,
    total: int,
    shared: bool,
    mode: Mode,
    offload: bool,
    sleep: bool,
    share: float,
    peak: int,
    room: int,
    why: str,
) -> MemoryPlan:
    """The plan of one fitting choice; `peak`: the trainer's step with one row (`step_bytes`),
    `room`: the trainer's bytes while it steps."""
    return MemoryPlan(
        gpu_bytes=total,
        shared=shared,
        checkpointing=mode,
        offload=offload,
        sleep=sleep,
        vllm_share=share,
        kv_seqs=(share * total - vllm_bytes(job, 0)) / (job.max_model_len * kv_token_bytes(job)),
        trainer_bytes=peak,
        row_bytes=peak - static_bytes(job, offload),
        micro_batch_tokens=most_tokens(job, mode, offload, room),
        why=why,
    )


def levers_that_fit(job: Job, gpu_bytes: int, shared: bool, fixed: Levers) -> list[str]:
    """What would make a refused job fit, each alone: the fields to set."""
    free = Levers()
    found = []
    if fixed != free and plan(job, gpu_bytes, shared, free):
        set_ = [
            f
            for f, v in zip(
                (
                    "trainer.activation_checkpointing",
                    "trainer.optimizer_offload",
                    "inference.sleep",
                    "inference.gpu_memory_utilization",
                ),
                (fixed.checkpointing, fixed.offload, fixed.sleep, fixed.vllm_share),
                strict=True,
            )
            if v is not None
        ]
        found.append(f"leave {', '.join(set_)} unset (rlfleet chooses)")
    if fixed.offload is not True and plan(job, gpu_bytes, shared, replace(fixed, offload=True)):
        found.append("trainer.optimizer_offload = true (weights, gradients and AdamW on the host)")
    if job.trains_all and plan(replace(job, trains_all=False), gpu_bytes, shared, fixed):
        found.append("[trainer.lora] (adapters on a frozen base)")
    if shared and not job.on_policy and plan(replace(job, on_policy=True), gpu_bytes, shared, fixed):
        found.append(
            "orchestrator.max_async_level = 0 with inference.sleep = true (vLLM sleeps while the trainer steps)"
        )
    if job.transport_copies and plan(replace(job, transport_copies=0), gpu_bytes, shared, fixed):
        found.append('weights.transport = "filesystem" (no copy of the weights on the trainer\'s GPU)')
    if plan(replace(job, ranks=job.ranks * 8), gpu_bytes, shared, fixed):
        found.append("more trainer GPUs (FSDP2 shards the weights and AdamW over them)")
    shorter = replace(job, row_tokens=min(job.row_tokens, 2048), max_model_len=min(job.max_model_len, 2048))
    if shorter != job and plan(shorter, gpu_bytes, shared, fixed):
        found.append("orchestrator.seq_len and inference.max_model_len of 2048")
    return found
