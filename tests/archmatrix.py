"""The architecture matrix: a tiny random-init model per architecture through the trainer, vLLM and
every weight transport. tests/test_architectures.py runs it on CPU, benchmarks/arch_matrix.py
anywhere (GPU: cuda_ipc and nccl too).

Per architecture, one vLLM engine (`run_arch`):
  1. served: vLLM's logprobs on fixed tokens vs the trainer's at the weights vLLM started from, and
     `start`: every vLLM parameter and buffer (name, shape, dtype, hash) as its own loader built them.
  2. identity: each transport loads those same weights again; vLLM's tensors must equal `start` bit
     for bit. A fused q/k/v or gate/up in the wrong order, a stale or clobbered tied head, an expert
     in the wrong slot, a rotary buffer overwritten, a tensor left out: each shows here.
  3. per transport, one RL step: sample a group from vLLM, one GRPO step in the trainer, publish
     through the transport, load; vLLM's logprobs after the load vs the trainer's (max abs diff),
     and vLLM's names, shapes and dtypes still `start`'s.
An engine is vLLM with `logprobs`, `sample`, `rpc`, `load` and `close`: `Host` here (vLLM's `LLM` in
one child process that serves one architecture after another: one vLLM import for the whole
matrix keeps the CPU suite's time down) or benchmarks/arch_matrix.py's `Replica` (the `rlfleet
inference` server over HTTP, what a run uses). The worker code and its RPCs are the same.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlfleet.config.lora import LoraConfig
from rlfleet.config.loss import LossConfig
from rlfleet.config.models import InferenceJobConfig, ModelConfig, TrainerConfig
from rlfleet.microbatches import micro_batches
from rlfleet.orchestrator.rollout import single_turn
from rlfleet.store import RunStore
from rlfleet.trainer.lora import wrap
from rlfleet.trainer.losses.objective import PolicyLoss
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.tiny import make_tiny_model
from rlfleet.trainer.train import Policy, default_head_chunk, load_model, make_optimizer, train_step
from rlfleet.weights.client import load_rpc
from rlfleet.weights.controller import make_controller
from rlfleet.weights.tickets import write_served
from tests.helpers import free_port

PROMPT = [1, *range(40, 100)]  # 61 tokens: past Gemma's 32-token sliding window
TRANSPORTS_CPU = ("filesystem", "nccl")  # nccl runs over gloo on a CPU; cuda_ipc needs a GPU
TRANSPORTS_GPU = ("filesystem", "cuda_ipc", "nccl")
WARNED = ("Failed to load weights", "were not loaded")  # vLLM's words for a load that missed tensors


def make_arch_model(root: Path, arch: str, sharpen: bool) -> Path:
    """`rlfleet model tiny --arch`, at `root/arch`. `sharpen`: Gemma-2's q/k x 30 and head x 5, so
    that its soft-caps (attention 50, logits 30) bite: dropping either moves the logprobs by 0.2-1.3
    nats, where random-init scores (~0.1) match with the caps ignored; 2 nats of entropy stay for
    sampling (a float32 check: bfloat16 is too coarse at these magnitudes)."""
    model_dir = make_tiny_model(root / arch, seed=0, arch=arch)
    if sharpen and arch == "gemma2":
        lm = load_model(str(model_dir), "float32", torch.device("cpu"))
        with torch.no_grad():
            for layer in lm.model.layers:
                layer.self_attn.q_proj.weight.mul_(30.0)
                layer.self_attn.k_proj.weight.mul_(30.0)
            lm.get_output_embeddings().weight.mul_(5.0)
        lm.save_pretrained(model_dir)
    return model_dir


def engine_settings(gpu: bool) -> dict[str, Any]:
    """vLLM as `rlfleet inference` starts it: bf16 on a GPU (the trainer keeps fp32 masters), the
    model's float32 on a CPU; a GPU shared with the trainer (cuda_ipc needs one)."""
    return {"dtype": "bfloat16" if gpu else "float32", "max_model_len": 128, "gpu_util": 0.3}


def _host(conn, env: dict[str, str]) -> None:
    """The child process of `Host`: vLLM's `LLM`, one model at a time, driven over `conn`."""
    import gc
    import os

    os.environ.update(env)
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    warned: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if any(w in record.getMessage() for w in WARNED):
                warned.append(record.getMessage())

    catch = Catch(logging.WARNING)
    loggers = [
        logging.getLogger(f"vllm.model_executor.model_loader.reload.{n}") for n in ("layerwise", "inplace")
    ]
    llm = None
    while True:
        cmd, arg = conn.recv()
        try:
            if cmd == "exit":
                break
            if cmd == "start":
                llm = LLM(**arg)
                out: Any = None
            elif cmd == "stop":
                del llm
                llm = None
                gc.collect()
                cleanup_dist_env_and_memory()
                out = None
            elif cmd == "logprobs":
                sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
                (res,) = llm.generate([{"prompt_token_ids": arg}], sp, use_tqdm=False)
                out = [
                    entry[tok].logprob for entry, tok in zip(res.prompt_logprobs[1:], arg[1:], strict=True)
                ]
            elif cmd == "sample":
                sp = SamplingParams(
                    n=arg["n"], max_tokens=arg["max_tokens"], temperature=1.0, logprobs=0, seed=0
                )
                (res,) = llm.generate([{"prompt_token_ids": arg["prompt"]}], sp, use_tqdm=False)
                out = [
                    (
                        list(c.token_ids),
                        [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)],
                    )
                    for c in res.outputs
                ]
            elif cmd == "rpc":
                warned.clear()
                for log in loggers:  # vLLM's logging set-up drops handlers added before it
                    if catch not in log.handlers:
                        log.addHandler(catch)
                out = {
                    "results": llm.collective_rpc(
                        arg["method"], args=tuple(arg.get("args", ())), kwargs=arg.get("kwargs")
                    )
                }
                llm.reset_prefix_cache()  # what /pause?clear_cache=true does before a load
                out["warnings"] = list(warned)
            conn.send(("ok", out))
        except Exception:
            conn.send(("error", traceback.format_exc()))


class Host:
    """vLLM's `LLM` in a child process (vLLM pins threads and cores: not in the test's process),
    the same engine settings and worker extension as `rlfleet inference`, one model at a time."""

    def __init__(self):
        from rlfleet.inference.server import replica_env

        cfg = InferenceJobConfig(model=ModelConfig(path="unused"))
        env = {**replica_env(cfg, 0), "VLLM_LOGGING_LEVEL": "WARNING"}
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_host, args=(child, env), daemon=True)
        self.proc.start()

    def _ask(self, cmd: str, arg: Any = None) -> Any:
        self.conn.send((cmd, arg))
        status, out = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"vLLM host: {cmd} failed:\n{out}")
        return out

    def serve(self, model_dir: Path) -> Host:
        from rlfleet.weights import WORKER_EXTENSION

        s = engine_settings(False)
        self._ask(
            "start",
            dict(
                model=str(model_dir),
                dtype=s["dtype"],
                max_model_len=s["max_model_len"],
                enforce_eager=True,
                seed=0,
                logprobs_mode="processed_logprobs",
                worker_extension_cls=WORKER_EXTENSION,
            ),
        )
        return self

    def logprobs(self, ids: list[int]) -> list[float]:
        return self._ask("logprobs", ids)

    def sample(self, prompt: list[int], n: int, max_tokens: int) -> list[tuple[list[int], list[float]]]:
        return [
            (list(i), list(lp))
            for i, lp in self._ask("sample", {"prompt": prompt, "n": n, "max_tokens": max_tokens})
        ]

    def rpc(self, method: str, *args: str) -> list[Any]:
        return self._ask("rpc", {"method": method, "args": args})["results"]

    def load(self, t: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        out = self._ask("rpc", load_rpc(t))
        return {"load": time.perf_counter() - t0, "warnings": out["warnings"]}

    def close(self) -> None:
        self._ask("stop")

    def exit(self) -> None:
        try:
            self.conn.send(("exit", None))
        finally:
            self.proc.join(timeout=5)  # every engine is stopped; vLLM's exit handlers are slow
            if self.proc.is_alive():
                self.proc.kill()


class Sender:
    """The trainer's publishers for `transports`, one store; `send` publishes a step and has
    `engine` load it as the controller would (the nccl send runs beside the load). `nccl_device`:
    where nccl's sender sits when not on the trainer's GPU (NCCL refuses two ranks on one GPU)."""

    def __init__(
        self,
        store: RunStore,
        device: torch.device,
        model_dir: Path,
        dtype: str,
        transports: tuple[str, ...],
        nccl_device: torch.device | None = None,
    ):
        from rlfleet.weights.filesystem import FilesystemPublisher

        self.store, self.pubs = store, {}
        par = Parallel(device=device)
        for name in transports:
            if name == "filesystem":
                self.pubs[name] = FilesystemPublisher(store, par, str(model_dir), keep=2)
            elif name == "nccl":
                from rlfleet.weights.nccl import NcclPublisher

                nccl_par = Parallel(device=nccl_device or device)
                self.pubs[name] = NcclPublisher(
                    store, nccl_par, dtype, free_port(), receivers=1, timeout_s=120
                )
            elif name == "cuda_ipc":
                from rlfleet.weights.cuda_ipc import IpcPublisher

                self.pubs[name] = IpcPublisher(store, par, dtype, timeout_s=120)
        write_served(store, -1)  # nothing loaded yet: cuda_ipc's step 0 waits on "step -1 served"
        self.step = 0

    def send(self, name: str, policy: torch.nn.Module, engine: Any) -> dict[str, Any]:
        pub, step = self.pubs[name], self.step
        t0 = time.perf_counter()
        pub.publish(step, policy)
        published = time.perf_counter() - t0
        failed: list[BaseException] = []

        def serve() -> None:
            try:
                pub.serve(step)
            except BaseException as e:  # noqa: BLE001 - reported below
                failed.append(e)

        sender = threading.Thread(target=serve)
        sender.start()
        try:
            t1 = time.perf_counter()
            times = engine.load(make_controller(name).ticket(self.store, step))
            loaded = time.perf_counter() - t1
        finally:
            sender.join(timeout=120)
        if failed:
            raise failed[0]
        write_served(self.store, step)
        self.step += 1
        return {"publish_s": published, "load_s": loaded, "warnings": times.get("warnings", [])}

    def close(self) -> None:
        for pub in self.pubs.values():
            pub.close()


def trainer_logprobs(policy: Policy, ids: list[int]) -> list[float]:
    with torch.no_grad():
        device = next(policy.parameters()).device
        return policy(torch.tensor([ids], device=device))[0][0].float().tolist()


def rl_step(policy: Policy, opt: torch.optim.Optimizer, engine: Any, tc: TrainerConfig) -> dict[str, Any]:
    """A group of 4 samples from vLLM, alternate advantages +-1 (the weight path is under test, not
    learning), one GRPO step; `logprob_diff_max` = max |trainer - vLLM| over the sampled tokens."""
    samples = engine.sample(PROMPT[:9], n=4, max_tokens=8)
    recs = [
        {**single_turn(PROMPT[:9], ids, lps), "advantage": 1.0 if i % 2 == 0 else -1.0}
        for i, (ids, lps) in enumerate(samples)
    ]
    n = sum(sum(r["loss_mask"]) for r in recs)
    return train_step(policy, opt, micro_batches(recs, 0, 4), PolicyLoss(LossConfig(), n), tc.max_grad_norm)


def off(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def layout(params: dict[str, list]) -> dict[str, tuple]:
    """Names, shapes and dtypes of `rlfleet_params`' answer, without the hashes."""
    return {k: (tuple(v[0]), v[1]) for k, v in params.items()}


def changed(before: dict[str, list], after: dict[str, list]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def run_arch(
    arch: str,
    model_dir: Path,
    tmp: Path,
    engine_for: Callable[[Path], Any],
    transports: tuple[str, ...],
    device: torch.device,
    nccl_device: torch.device | None = None,
    lora: LoraConfig | None = None,
) -> dict[str, Any]:
    """The matrix row of `arch` (its model at `model_dir`); `engine_for(model_dir)` starts vLLM on
    it. The row says what held; `row_ok` says what did not (the caller asserts or records).
    `lora`: the trainer trains adapters on the frozen model, and vLLM gets the merged weights."""
    gpu = device.type == "cuda"
    lm = load_model(str(model_dir), "float32", device)
    policy = Policy(
        lm if lora is None else wrap(lm, lora),
        lm_head_chunk=default_head_chunk(device, lm.get_output_embeddings().weight.shape[0]),
    )
    tc = TrainerConfig(lr=1e-2)
    opt = make_optimizer(policy, tc)
    row: dict[str, Any] = {"arch": arch, "transports": {}}
    t0 = time.perf_counter()
    engine = engine_for(model_dir)
    row["start_s"] = time.perf_counter() - t0
    dtype = engine_settings(gpu)["dtype"]
    sender = Sender(RunStore(tmp / arch / "run"), device, model_dir, dtype, transports, nccl_device)
    try:
        start = engine.rpc("rlfleet_params")[0]
        row["vllm_tensors"] = len(start)
        row["served_diff"] = off(engine.logprobs(PROMPT), trainer_logprobs(policy, PROMPT))
        for name in transports:  # the start weights again, through each transport
            sent = sender.send(name, policy, engine)
            row["transports"][name] = {
                "identity_changed": changed(start, engine.rpc("rlfleet_params")[0]),
                **sent,
            }
        for name in transports:  # one RL step each, its weights through the transport
            before = engine.logprobs(PROMPT)
            metrics = rl_step(policy, opt, engine, tc)
            sent = sender.send(name, policy, engine)
            after = engine.logprobs(PROMPT)
            got = row["transports"][name]
            got["rl_step"] = {k: metrics[k] for k in ("loss", "grad_norm", "logprob_diff_max")}
            got["moved"] = off(before, after)
            got["max_abs_diff"] = off(after, trainer_logprobs(policy, PROMPT))
            got["layout_same"] = layout(start) == layout(engine.rpc("rlfleet_params")[0])
            got["load_s"], got["warnings"] = sent["load_s"], got["warnings"] + sent["warnings"]
    finally:
        sender.close()
        engine.close()
    return row


def row_ok(row: dict[str, Any], tol: float) -> list[str]:
    """What failed in a matrix row (empty: all held)."""
    bad = []
    if row["served_diff"] > tol:
        bad.append(f"vLLM serves other logprobs than the trainer at the start: {row['served_diff']:.2e}")
    for name, t in row["transports"].items():
        if t["identity_changed"]:
            bad.append(f"{name}: reloading the start weights changed {t['identity_changed'][:5]}")
        if t["warnings"]:
            bad.append(f"{name}: vLLM warned {t['warnings'][:3]}")
        if not t["layout_same"]:
            bad.append(f"{name}: vLLM's tensor names/shapes/dtypes changed after the load")
        if t["max_abs_diff"] > tol or not t["moved"] > 1e-2:  # matches, and the load took effect
            bad.append(
                f"{name}: after the load {t['max_abs_diff']:.2e} off the trainer (moved {t['moved']:.2e})"
            )
        if t["rl_step"]["logprob_diff_max"] > tol:
            bad.append(f"{name}: trainer vs vLLM on sampled tokens {t['rl_step']['logprob_diff_max']:.2e}")
    return bad


def dump(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, indent=1, default=str)
