"""The engine host: a real vLLM engine in its own process and environment, driven over stdin / stdout
(`python -m convcheck.rollout.host`, run by the engine's interpreter with the repo on PYTHONPATH).

It loads the source checkpoint with the engine's own loader (the reference), records what the engine computes with,
poisons it, receives a sync through the chosen receiver (vLLM's `reload_weights` by default), and reports what the
engine computes with afterwards. "What the engine computes with" is:
- every parameter, as vLLM's own `compute_tensor_digests` reads it (`params`);
- every weight the CPU backend packs away (dense linears, router, embedding / lm_head: `named_parameters()` then
  shows shape (0,), or a visible copy the kernel no longer reads), as it was at its last packing (`packed`): the
  host wraps vLLM's `dispatch_cpu_unquantized_gemm` to keep a copy of the weight it is handed, changing nothing else.
  A packed layer whose packing did not run during a sync computes with its earlier weights: `stale`. Where the
  dispatch packs nothing (a CPU without AMX or oneDNN: vLLM falls back to torch's linear over the live parameter),
  no copy is kept and the parameter is what the layer computes with.
- the prompt logprobs and greedy tokens of fixed prompts (`outputs`).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import transformers
from safetensors import safe_open

from convcheck.hooks import load_hook
from convcheck.rollout import protocol
from convcheck.rollout.buckets import folder_names, read_bucket, read_folder

WeightIter = Iterator[tuple[str, torch.Tensor]]


class PackTap:
    """Keeps a copy of every weight the CPU backend packs (vLLM's `dispatch_cpu_unquantized_gemm`), per module object,
    and counts the packings: what each packed layer computes with."""

    def __init__(self) -> None:
        self.weights: dict[int, torch.Tensor] = {}
        self.count: Counter[int] = Counter()
        self.installed = False

    def install(self) -> None:
        try:
            from vllm.model_executor.layers import utils
        except ImportError:
            return
        original = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
        if original is None:
            return

        def tapped(layer: torch.nn.Module, remove_weight: bool) -> None:
            weight = getattr(layer, "weight", None)
            kept = None
            if isinstance(weight, torch.Tensor) and not weight.is_meta and weight.ndim == 2:
                kept = weight.detach().clone()
            original(layer, remove_weight)
            if kept is not None and not reads_its_weight(layer, kept):
                self.weights[id(layer)] = kept
                self.count[id(layer)] += 1

        utils.dispatch_cpu_unquantized_gemm = tapped
        self.installed = True


def reads_its_weight(layer: torch.nn.Module, weight: torch.Tensor) -> bool:
    """Whether the layer's dispatched CPU GEMM (`layer.cpu_linear(x, weight, bias)`) computes with the weight it is
    handed, as vLLM's torch-linear fallback does, rather than a copy packed at dispatch: one row of ones through it
    with `weight` [N, K] and with `weight + 1` (their outputs differ by K per element unless the argument is
    ignored). A layer without `cpu_linear` computes with its parameter."""
    linear = getattr(layer, "cpu_linear", None)
    if linear is None:
        return True
    x = torch.ones(1, weight.shape[1], dtype=weight.dtype)
    with torch.no_grad():
        a, b = (linear(x, w, None).contiguous().reshape(-1).view(torch.uint8) for w in (weight, weight + 1))
    return bool((a != b).any())  # raw bytes: any output element moved


class Host:
    """One engine, its reference state, and the requests the client sends."""

    def __init__(self) -> None:
        self.tap = PackTap()
        self.tap.install()
        self.llm: Any = None
        self.model: Any = None
        self.names: dict[int, str] = {}
        self.reference: dict[str, torch.Tensor] = {}
        self.marks: dict[int, int] = {}
        self.prompts: list[list[int]] = [list(p) for p in protocol.PROMPTS]

    # -- requests -------------------------------------------------------------------------------------------------
    def start(self, model: str, max_model_len: int = 64, engine_args: dict[str, Any] | None = None) -> dict[str, Any]:
        """Load `model` with the engine's own loader; the state it computes with becomes the reference."""
        from vllm import LLM

        started = time.perf_counter()
        kwargs = {"dtype": "auto", "enforce_eager": True, "skip_tokenizer_init": True,
                  "max_model_len": max_model_len, "max_num_seqs": len(self.prompts), "max_num_batched_tokens": 256,
                  "seed": 0, **(engine_args or {})}  # fmt: skip
        self.llm = LLM(model=model, **kwargs)
        self.model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
        self.names = {id(m): n for n, m in self.model.named_modules()}
        load_s = time.perf_counter() - started
        self.reference = self.state()
        self.marks = dict(self.tap.count)
        return {
            "versions": versions(),
            "seconds": round(load_s, 3),
            "state": describe(self.reference),
            "outputs": self.outputs(),
        }

    def state(self) -> dict[str, torch.Tensor]:
        """What the engine computes with now: every parameter (`params.NAME`) and every packed weight as last
        packed (`packed.MODULE.weight`), as CPU tensors."""
        out = {f"params.{n}": p.detach().cpu().clone() for n, p in self.model.named_parameters()}
        for key, weight in self.tap.weights.items():
            if key in self.names:
                out[f"packed.{self.names[key]}.weight"] = weight
        return out

    def outputs(self) -> dict[str, Any]:
        """Prompt logprobs (each prompt token's, from position 1) and greedy tokens with their logprobs."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=protocol.MAX_TOKENS, temperature=0.0, prompt_logprobs=0, logprobs=0,
                                detokenize=False, ignore_eos=True)  # fmt: skip
        prompts = [{"prompt_token_ids": p} for p in self.prompts]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        out = []
        for prompt, result in zip(self.prompts, results, strict=True):
            positions = result.prompt_logprobs or []
            prompt_lp = [None if p is None else p[prompt[i]].logprob for i, p in enumerate(positions)]
            sample = result.outputs[0]
            tokens = list(sample.token_ids)
            token_lp = [step[t].logprob for step, t in zip(sample.logprobs or [], tokens, strict=False)]
            out.append({"prompt": prompt, "prompt_logprobs": prompt_lp, "tokens": tokens, "token_logprobs": token_lp})
        return {"prompts": out}

    def save(self, path: str) -> dict[str, Any]:
        """Write the reference state (what the fresh load computes with) to `path` for another engine to compare
        against."""
        torch.save(self.reference, path)
        return {"path": path}

    def snapshot(self) -> dict[str, Any]:
        """Make what the engine computes with now the reference later inspections compare against (the idempotence
        check's state after its first sync), and mark the packings so far."""
        self.reference = self.state()
        self.marks = dict(self.tap.count)
        return {"state": describe(self.reference), "outputs": self.outputs()}

    def inspect(self, against: str | None = None) -> dict[str, Any]:
        """The state now against the reference, or against the state another engine saved at `against` (first
        differing element of each tensor that differs), which packed layers were packed again since the last mark,
        and the outputs."""
        reference = self.reference if against is None else torch.load(against, weights_only=True)
        now = self.state()
        repacked = {self.names[k]: self.tap.count[k] - self.marks.get(k, 0) for k in self.tap.count if k in self.names}
        self.marks = dict(self.tap.count)
        return {"diffs": differences(reference, now), "repacked": repacked, "outputs": self.outputs(),
                "state": describe(now)}  # fmt: skip

    def poison(self, model: str) -> dict[str, Any]:
        """Reload every checkpoint tensor with its sign bit flipped through vLLM's own reload path, so a later sync
        that misses an element leaves it visibly wrong."""
        started = time.perf_counter()
        self.reload(flip_sign(checkpoint_tensors(model)))
        return {"seconds": round(time.perf_counter() - started, 3), **self.inspect()}

    def reload(self, weights: WeightIter) -> None:
        """vLLM's supported in-place update: the worker's `reload_weights` (what RL frameworks call)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    def sync(self, receiver: str, incoming: Callable[[], WeightIter], folder: str | None = None) -> dict[str, Any]:
        """Feed the buckets the client streams to `receiver` ("reload" or MODULE:FUNC / FILE.py:FUNC called as
        FUNC(llm, weights)); what the receiver did not read is still drained. The counts of what it was handed.
        With the folder transport (`folder`: the client's safetensors files), "reload" is vLLM's
        `reload_weights(weights_path=folder)` (vLLM reads the files; every tensor in them counts as handed over), and
        a receiver function is handed the files' tensors."""
        counts: Counter[str] = Counter()
        started = time.perf_counter()
        if folder is not None and receiver == "reload":
            error = None
            counts.update(folder_names(folder))
            try:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
            except Exception as exc:  # noqa: BLE001 - a raising receiver is the client's finding
                error = raised(exc)
            return {"received": dict(counts), "error": error, "seconds": round(time.perf_counter() - started, 3)}
        stream = incoming()

        def counted() -> WeightIter:
            for name, tensor in stream:
                counts[name] += 1
                yield name, tensor

        error = None
        try:
            if receiver == "reload":
                self.reload(counted())
            else:
                load_hook(receiver, what="engine receiver")(self.llm, counted())
        except Exception as exc:  # noqa: BLE001 - a raising receiver is the client's finding
            error = raised(exc)
        for _ in stream:
            pass
        return {"received": dict(counts), "error": error, "seconds": round(time.perf_counter() - started, 3)}

    def repair(self) -> dict[str, Any]:
        """The workaround for vLLM's skipped CPU MoE prepack on a weight update (named as the upstream bug
        vllm-cpu-moe-reload-prepack): run the prepack the update skipped on every unquantized CPU MoE layer whose
        expert weights no longer match their reference bytes. Returns the layers it ran on."""
        fixed = []
        for name, module in self.model.named_modules():
            method = getattr(module, "quant_method", None)
            kernel = getattr(method, "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if experts is None or type(experts).__name__.find("CPU") < 0 or not hasattr(module, "w13_weight"):
                continue
            mine = [f"params.{name}.{w}" for w in ("w13_weight", "w2_weight")]
            if all(_same(self.reference.get(k), getattr(module, k.rsplit(".", 1)[1])) for k in mine):
                continue
            experts.process_weights_after_loading(module)
            fixed.append(name)
        return {"repaired": fixed}


# -- helpers ---------------------------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    import vllm

    return {
        "vllm": vllm.__version__,
        "engine-torch": torch.__version__,
        "engine-transformers": transformers.__version__,
    }


def describe(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Name -> [shape, dtype, sha256 of the raw bytes] (vLLM's compute_tensor_digests reads parameters the same way)."""
    return {
        name: [list(t.shape), str(t.dtype).removeprefix("torch."), hashlib.sha256(_raw(t).numpy()).hexdigest()]
        for name, t in state.items()
    }


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_raw(a), _raw(b.detach().cpu())))


def differences(reference: dict[str, torch.Tensor], now: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Every tensor of `now` or `reference` whose raw bytes differ: its shapes and dtypes, the count of differing
    elements and the first one (index, both elements' raw bits as integers)."""
    out = []
    for name in sorted(set(reference) | set(now)):
        a, b = reference.get(name), now.get(name)
        entry: dict[str, Any] = {"name": name}
        if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
            entry.update(kind="shape", expected=_shape(a), got=_shape(b))
            out.append(entry)
            continue
        if a.numel() == 0:
            continue
        ints = _int_dtype(a.element_size())
        x, y = a.contiguous().view(ints).reshape(-1), b.contiguous().view(ints).reshape(-1)
        wrong = (x != y).nonzero().reshape(-1)
        if wrong.numel() == 0:
            continue
        first = int(wrong[0])
        index = [int(i) for i in torch.unravel_index(torch.tensor(first), tuple(a.shape))]
        entry.update(kind="bytes", count=int(wrong.numel()), total=a.numel(), index=index,
                     expected_bits=int(x[first]) & _mask(a), got_bits=int(y[first]) & _mask(a),
                     expected_value=_value(a, first), got_value=_value(b, first),
                     dtype=str(a.dtype).removeprefix("torch."))  # fmt: skip
        out.append(entry)
    return out


def _shape(t: torch.Tensor | None) -> Any:
    return None if t is None else [list(t.shape), str(t.dtype).removeprefix("torch.")]


def _int_dtype(size: int) -> torch.dtype:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]


def _mask(t: torch.Tensor) -> int:
    return (1 << (8 * t.element_size())) - 1


def _value(t: torch.Tensor, flat: int) -> float | None:
    value = t.reshape(-1)[flat]
    return float(value) if value.is_floating_point() else int(value)


def checkpoint_tensors(folder: str) -> WeightIter:
    """Every tensor of the checkpoint's safetensors files, in name order."""
    from pathlib import Path

    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in sorted(handle.keys()):
                yield name, handle.get_tensor(name)


def flip_sign(weights: WeightIter) -> WeightIter:
    """Each floating tensor with every element's sign bit flipped (every element's bits change); others as they are."""
    for name, tensor in weights:
        if tensor.is_floating_point():
            ints = _int_dtype(tensor.element_size())
            bit = torch.tensor(-(1 << (8 * tensor.element_size() - 1)), dtype=ints)
            tensor = (tensor.contiguous().view(ints) ^ bit).view(tensor.dtype)
        yield name, tensor


def raised(exc: BaseException) -> dict[str, str]:
    """One line for an exception and where it was raised (the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename.rsplit('site-packages/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    text = " ".join(str(exc).split())
    return {"error": f"{type(exc).__name__}: {text}"[:600], "where": where}


def serve(inp: Any, out: Any) -> None:
    """Answer requests until `quit` or the end of the input."""
    host = Host()

    def incoming() -> WeightIter:
        while True:
            message = protocol.receive(inp)
            if message.get("op") == "end":
                return
            items = read_bucket(message)
            protocol.send(out, {"ack": True})
            yield from items

    while True:
        try:
            request = protocol.receive(inp)
        except protocol.HostGone:
            return
        op = request.pop("op", None)
        if op == "quit":
            protocol.send(out, {"ok": True})
            return
        try:
            if op == "sync" and request.get("folder"):
                folder = request["folder"]
                reply = host.sync(request["receiver"], partial(read_folder, folder), folder=folder)
            elif op == "sync":
                reply = host.sync(request["receiver"], incoming)
            elif op in ("start", "inspect", "poison", "repair", "save", "snapshot"):
                reply = getattr(host, op)(**request)
            else:
                raise ValueError(f"unknown request {op!r}")
            protocol.send(out, {"ok": True, **reply})
        except Exception as exc:  # noqa: BLE001 - every failure is one reply line
            protocol.send(out, {"ok": False, **raised(exc)})


def main() -> int:
    """stdin / stdout carry the protocol; vLLM's own logging goes to stderr."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but protocol lines on the real stdout
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    serve(inp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
