"""Rollout engines: what samples a turn's tokens for :class:`~kgsynth.agent.rollout.TokenPolicy`.

Token ids in, token ids and their log-probs out; an engine never tokenizes or re-tokenizes text.
Three engines (``kgsynth train rl --rollout-engine hf|static|vllm``):

- :class:`HFEngine` (``hf``): batched ``generate`` on the policy module itself (left-padded,
  the torch global RNG), so it always samples from the weights being trained;
  :meth:`~HFEngine.refresh` has nothing to do.
- :class:`~kgsynth.agent.static_engine.StaticEngine` (``static``): a Llama policy's live
  weights decoded with a preallocated KV cache and a prefix cache kept across an episode's
  turns (a turn prefills only its new tokens); sampled as ``hf`` samples. For small policies.
- :class:`VLLMEngine` (``vllm``): a vLLM ``LLM`` colocated in the training process (one per
  rank, tensor parallel 1, ``gpu_memory_utilization`` of the GPU), built from a saved model
  folder; after each optimizer update :meth:`~VLLMEngine.refresh` loads the policy's current
  weights into it in place, as TRL's colocate mode does. vLLM is an optional extra
  (``pip install kgsynth[vllm]``) and needs a CUDA GPU; it is imported only here, only when
  this engine is built.

    engine = make_engine("hf", model=model, tokenizer=tok)
    outs = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=16, temperature=1.0))
    engine.refresh(model)  # after each optimizer update

The contract every engine keeps (what :class:`~kgsynth.agent.rollout.TokenPolicy` relies on):
a :class:`Completion` per prompt, in order; its ids end at the first of ``stop_ids`` (that id
included) or after ``max_new_tokens``; an engine may also stop once the decoded tail ends with
one of ``stop_strings``, and the policy cuts there itself either way; each log-prob is the
sampled token's under the sampling distribution at ``temperature`` (before top-p), at most 0,
which is what the training forward computes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from kgsynth.agent.engine_api import Completion, EngineUnavailable, RolloutEngine, SamplingParams

log = logging.getLogger(__name__)

ENGINES = ("auto", "hf", "static", "vllm")
VLLM_MISSING = (
    "--rollout-engine vllm needs vLLM, an optional extra that needs a CUDA GPU: "
    "pip install kgsynth[vllm] (or use --rollout-engine hf)"
)


def _cut_at_stop(ids: list[int], logprobs: list[float], stop_ids: frozenset[int]) -> Completion:
    for j, t in enumerate(ids):
        if t in stop_ids:
            return Completion(ids[: j + 1], logprobs[: j + 1])
    return Completion(ids, logprobs)


class HFEngine:
    """Batched transformers ``generate`` on the policy module (its live weights)."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tok = tokenizer
        eos = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        """One completion per prompt, sampled together (left padding); the torch global RNG."""
        import torch

        device = next(self.model.parameters()).device
        width = max(len(b) for b in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, b in enumerate(prompts):  # left padding
            ids[i, width - len(b) :] = torch.tensor(list(b), dtype=torch.long)
            att[i, width - len(b) :] = 1
        temperature = params.temperature
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=temperature > 0,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(params.stop_ids) or None,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=params.top_p, top_k=0)
        if params.stop_strings:
            kwargs.update(stop_strings=list(params.stop_strings), tokenizer=self.tok)
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=att.to(device), **kwargs
            )
        if was_training:
            self.model.train()
        new = out.sequences[:, width:].cpu()
        # the raw logits at the sampling temperature: the distribution before top-p, as the
        # training forward computes it
        scale = temperature if temperature > 0 else 1.0
        logits = torch.stack(out.logits, dim=1).float().cpu() / scale
        logp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        return [
            _cut_at_stop(
                new[row].tolist(), [min(0.0, float(v)) for v in logp[row]], params.stop_ids
            )
            for row in range(len(prompts))
        ]

    def refresh(self, model: Any) -> None:
        """Nothing to do: generation runs on the policy module itself."""
        if model is not self.model:
            raise ValueError("the hf engine samples from the policy module it was built with")


def import_vllm() -> Any:
    """The ``vllm`` package, or :class:`EngineUnavailable` with the one-line fix."""
    try:
        import vllm
    except ImportError as exc:
        raise EngineUnavailable(VLLM_MISSING) from exc
    return vllm


def check_vllm_available() -> None:
    """Raise :class:`EngineUnavailable` when vLLM is not installed or there is no CUDA GPU
    (without importing vLLM itself, which is slow)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(VLLM_MISSING)
    import torch

    if not torch.cuda.is_available():
        raise EngineUnavailable(
            "--rollout-engine vllm needs a CUDA GPU and this process sees none "
            "(use --rollout-engine hf on CPU)"
        )


def _named_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """The module's parameters by name, each gathered whole for the moment it is read when
    DeepSpeed ZeRO-3 holds it in shards (a collective: every rank walks the same list)."""
    for name, param in model.named_parameters():
        if hasattr(param, "ds_id"):  # a ZeRO-3 shard
            import deepspeed

            with deepspeed.zero.GatheredParameters([param]):
                yield name, param.data
        else:
            yield name, param.data


class VLLMEngine:
    """A vLLM ``LLM`` in this process, sampling token-in/token-out; its weights are the
    policy's, loaded in place by :meth:`refresh` after each update.

    One engine per rank (``distributed_executor_backend="external_launcher"``, tensor parallel
    1, seeded by rank), each on the rank's own GPU beside the policy, its reference and the
    optimizer: ``gpu_memory_utilization`` is the share of that GPU vLLM may take for its copy
    of the weights and its KV cache."""

    name = "vllm"

    def __init__(
        self,
        model_dir: str,
        *,
        gpu_memory_utilization: float,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
    ) -> None:
        check_vllm_available()
        vllm = import_vllm()
        # vLLM's external launcher joins the process group torchrun or deepspeed set up; a
        # single process needs the same variables
        rank = int(os.environ.get("RANK", "0"))
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(_free_port())
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=str(model_dir),
            tokenizer=str(model_dir),
            dtype=dtype,
            tensor_parallel_size=1,
            gpu_memory_utilization=gpu_memory_utilization,
            distributed_executor_backend="external_launcher",
            seed=seed + rank,
            max_model_len=max_model_len,
            # log-probs after temperature, the distribution the training forward computes
            logprobs_mode="processed_logprobs",
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        """One completion per prompt. Each request's seed is drawn from the torch global RNG,
        so a seeded rollout draws the same requests."""
        import torch

        if params.top_p != 1.0:
            # vLLM's processed log-probs are of the nucleus, which the training forward is not
            raise ValueError("the vllm engine samples with top_p 1 only")
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        sampling = [
            self._vllm.SamplingParams(
                n=1,
                temperature=params.temperature,
                top_p=1.0,
                max_tokens=params.max_new_tokens,
                stop_token_ids=sorted(params.stop_ids),
                stop=list(params.stop_strings) or None,
                include_stop_str_in_output=True,
                skip_special_tokens=False,
                logprobs=0,
                seed=int(s),
            )
            for s in seeds
        ]
        inputs = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        outputs = self.llm.generate(inputs, sampling_params=sampling, use_tqdm=False)
        done = []
        for out in outputs:
            (o,) = out.outputs
            ids = list(o.token_ids)
            lps = [
                min(0.0, float(step[t].logprob)) for t, step in zip(ids, o.logprobs, strict=True)
            ]
            done.append(_cut_at_stop(ids, lps, params.stop_ids))
        return done

    def refresh(self, model: Any) -> None:
        """Load ``model``'s current weights into the engine in place and drop its prefix cache
        (cached keys and values were computed with the old weights)."""
        worker_model = self._worker_model()
        for name, tensor in _named_weights(model):
            worker_model.load_weights([(name, tensor)])
        self.llm.reset_prefix_cache()

    def _worker_model(self) -> Any:
        # in-process (external launcher): the executor's one worker holds the model itself
        # (TRL's colocate path); vLLM versions without that attribute chain run a function on
        # the model instead, which in process hands back the module itself
        try:
            return self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        except AttributeError:
            (module,) = self.llm.apply_model(lambda m: m)
            return module


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_engine(name: str, *, model: Any, tokenizer: Any, **vllm_options: Any) -> RolloutEngine:
    """The engine ``name`` for a policy ``model`` (``static`` ignores the vLLM options, and a
    model it cannot run is :class:`EngineUnavailable`); ``vllm`` takes :class:`VLLMEngine`'s
    options (``model_dir``, ``gpu_memory_utilization``, ``dtype``, ``seed``). ``auto``: the
    static engine for a policy it runs on a CPU (a plain Llama: the tiny model), else hf."""
    if name == "auto":
        if next(model.parameters()).device.type == "cpu":
            with contextlib.suppress(EngineUnavailable):
                return make_engine("static", model=model, tokenizer=tokenizer)
        return HFEngine(model, tokenizer)
    if name == "hf":
        return HFEngine(model, tokenizer)
    if name == "static":
        from kgsynth.agent.static_engine import StaticEngine
        from kgsynth.llm.kv_llama import UnsupportedModel

        try:
            return StaticEngine(model, tokenizer)
        except UnsupportedModel as exc:
            raise EngineUnavailable(f"--rollout-engine static: {exc}") from None
    if name == "vllm":
        engine = VLLMEngine(**vllm_options)
        engine.refresh(model)  # the policy's own weights, whatever folder the engine loaded
        return engine
    raise ValueError(f"unknown rollout engine {name!r} (one of {', '.join(ENGINES)})")


__all__ = [
    "ENGINES",
    "VLLM_MISSING",
    "Completion",
    "EngineUnavailable",
    "HFEngine",
    "RolloutEngine",
    "SamplingParams",
    "VLLMEngine",
    "check_vllm_available",
    "make_engine",
]
