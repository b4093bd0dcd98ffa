"""The ``hf`` backend: a local transformers checkpoint, batched generation on CPU or GPU.

A model trained by ``kgsynth train`` (a ``save_pretrained`` folder) can itself generate data.

A Llama-architecture checkpoint (the tiny policy) generates through
:class:`~kgsynth.llm.static_decode.StaticDecoder` (``engine="auto"``, the default, on a CPU;
``"static"`` anywhere): batched decoding over a preallocated KV cache, drawing as ``generate`` draws
(``exact_rng``: the same tokens from the same seed), and a prefix cache, so an episode's next
turn prefills only what the last one added. Any other model, a LoRA adapter, or a generation
config asking for what the decoder does not do (a repetition penalty, beams, …) uses
``generate`` (``engine="hf"`` always does).

On CPU, ``workers=N`` generates in N processes, each holding the model and an equal share of
the CPU threads: a call's batches (``batch_size`` requests each, formed exactly as in one
process) are handed out to them, so the completions are the same as with one process, only
sooner on a machine with N free cores.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kgsynth.core.cores import all_cores
from kgsynth.core.errors import ConfigError
from kgsynth.core.modelio import adapter_base, is_adapter, is_model_folder
from kgsynth.core.text import clean_text
from kgsynth.llm.base import LLM, Completion, ProgressFn, Request
from kgsynth.llm.chat import chat_template

log = logging.getLogger(__name__)


def check_device(device: str) -> None:
    """A :class:`ConfigError` naming ``--device`` unless torch knows ``device`` and this machine
    has it: ``tpu9`` is no device, ``cuda`` on a CPU-only torch or ``cuda:3`` on a one-GPU
    machine is one this machine lacks."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(
            f"--device: {device!r} is not a device torch knows; use cpu, cuda, cuda:N or mps"
        ) from None
    if parsed.type == "cpu":
        return
    backend = getattr(torch, parsed.type, None)
    if parsed.type == "mps":
        backend = getattr(torch.backends, "mps", None)
    available = bool(backend is not None and backend.is_available())
    count = backend.device_count() if available and hasattr(backend, "device_count") else 1
    if not available:
        raise ConfigError(
            f"--device: {device} is not available on this machine (torch {torch.__version__}); "
            "use --device cpu"
        )
    if parsed.index is not None and parsed.index >= count:
        raise ConfigError(f"--device: {device}: this machine has {count} {parsed.type} device(s)")


ENGINES = ("auto", "static", "hf")
# generation settings the static decoder has no processor for, with their no-op values
_UNSUPPORTED = {
    "repetition_penalty": (None, 1.0), "num_beams": (None, 1), "no_repeat_ngram_size": (None, 0),
    "min_length": (None, 0), "min_new_tokens": (None,), "typical_p": (None, 1.0),
    "min_p": (None,), "top_h": (None,), "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0),
    "bad_words_ids": (None,), "suppress_tokens": (None,), "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,), "forced_eos_token_id": (None,), "sequence_bias": (None,),
    "renormalize_logits": (None, False), "encoder_repetition_penalty": (None, 1.0),
}  # fmt: skip


class HFLLM(LLM):
    backend = "hf"

    def __init__(
        self,
        model: str,
        *,
        device: str | None = None,
        batch_size: int = 8,
        workers: int = 1,
        base_model: str | None = None,
        engine: str = "auto",
    ) -> None:
        super().__init__()
        if engine not in ENGINES:
            raise ConfigError(f"the hf backend's engine must be one of {', '.join(ENGINES)}")
        self.engine = engine
        self._decoder: Any = None
        self._every_core = False  # workers > 1 asked, the static engine answering in-process
        path = Path(model)
        if not is_model_folder(path):
            raise ConfigError(
                f"--model: {model} is not a transformers checkpoint folder (no config.json)"
            )
        self.model = str(path)
        # a LoRA checkpoint's base model, found now: one that is not here fails before any work
        self.base_model = adapter_base(path, base_model) if is_adapter(path) else None
        if workers < 1:
            raise ConfigError(f"--workers must be >= 1 (got {workers})")
        self.batch_size = max(1, batch_size)
        self.workers = workers
        if device is not None:
            check_device(device)
        self.device = device
        self._model: Any = None
        self._tok: Any = None
        self._pool: Any = None
        self._digest: str | None = None

    @property
    def cache_fields(self) -> dict[str, Any]:
        """The model's file digest instead of its path, and what forms its batches."""
        if self._digest is None:
            from kgsynth.core.modelio import model_digest

            self._digest = model_digest(self.model)
        return {
            "backend": self.backend,
            "model_digest": self._digest,
            "batch_size": self.batch_size,
            "device": self._resolve_device(),
        }

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoTokenizer

        device = self._resolve_device()
        self._tok = AutoTokenizer.from_pretrained(self.model)
        self._tok.padding_side = "left"
        if self._tok.pad_token is None:
            self._tok.pad_token = self._tok.eos_token
        if self.engine != "hf" and device == "cpu" and self.base_model is None:
            # the static engine only reads the weights: a checkpoint it can hold exactly is
            # loaded without transformers' modelling packages (light_llama.py; ~1 s an eval)
            from kgsynth.llm.light_llama import load_light_llama, refusal

            why = refusal(self.model)
            if why is None:
                try:
                    self._model = load_light_llama(self.model, torch.float32)  # as on a CPU below
                    return
                except ValueError as exc:
                    why = str(exc)
            log.info("hf backend: the model's own class (%s)", why)
        self._load_model()

    def _load_model(self) -> None:
        """The checkpoint as transformers' own class (a LoRA run's merged into its base)."""
        import torch

        from kgsynth.core.modelio import load_causal_lm

        device = self._resolve_device()
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self._model = load_causal_lm(self.model, base_model=self.base_model, dtype=dtype).to(device)
        self._model.eval()

    def _resolve_device(self) -> str:
        """The device asked for (checked once, in ``__init__``), else CUDA where there is one,
        else the CPU."""
        if self.device is None:
            import torch

            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def _prompt(self, req: Request) -> str:
        return self._tok.apply_chat_template(
            req.message_dicts(),
            chat_template=chat_template(self._tok),
            tokenize=False,
            add_generation_prompt=True,
        )

    def _generate_group(self, reqs: Sequence[Request]) -> list[Completion]:
        import torch

        p = reqs[0].params
        texts = [self._prompt(r) for r in reqs]
        enc = self._tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.device
        )
        kwargs: dict[str, Any] = {
            "max_new_tokens": p.max_tokens,
            "pad_token_id": self._tok.pad_token_id,
            "do_sample": p.temperature > 0,
        }
        if p.temperature > 0:
            kwargs.update(temperature=p.temperature, top_p=p.top_p)
        if p.stop:
            kwargs.update(stop_strings=list(p.stop), tokenizer=self._tok)
        if p.seed is not None:
            torch.manual_seed(p.seed)
        with torch.no_grad():
            out = self._model.generate(**enc, **kwargs)
        prompt_len = enc["input_ids"].shape[1]
        results = []
        for row, mask in zip(out, enc["attention_mask"], strict=True):
            new = row[prompt_len:]
            text = self._tok.decode(new, skip_special_tokens=True)
            for stop in p.stop:  # keep the stop string, drop anything after it
                cut = text.find(stop)
                if cut >= 0:
                    text = text[: cut + len(stop)]
            n_new = int((new != self._tok.pad_token_id).sum())
            results.append(
                Completion(
                    clean_text(text),  # a byte-level tokenizer can decode half a character
                    finish_reason="stop" if n_new < p.max_tokens else "length",
                    prompt_tokens=int(mask.sum()),
                    completion_tokens=n_new,
                )
            )
        return results

    def _static(self) -> Any:
        """The static decoder for this model, or None where ``generate`` must run."""
        # auto: on a CPU only (its prefix cache takes memory a GPU's generate may need)
        wanted = self.engine == "static" or self._resolve_device() == "cpu"
        if self._decoder is None and self.engine != "hf" and wanted:
            from kgsynth.llm.kv_llama import UnsupportedModel
            from kgsynth.llm.static_decode import StaticDecoder

            gen = self._model.generation_config
            odd = [k for k, ok in _UNSUPPORTED.items() if getattr(gen, k, None) not in ok]
            try:
                if odd:
                    raise UnsupportedModel(f"its generation config sets {', '.join(odd)}")
                self._decoder = StaticDecoder(self._model, self._tok, exact_rng=True)
            except UnsupportedModel as exc:
                if self.engine == "static":
                    raise ConfigError(f"the static engine cannot run {self.model}: {exc}") from None
                log.info("hf backend: generate, not the static engine (%s)", exc)
                self._decoder = False
                if not hasattr(self._model, "generate"):  # the light weights: generate needs
                    self._load_model()  # the model's own class
        return self._decoder or None

    def _generate_static(self, decoder: Any, reqs: Sequence[Request]) -> list[Completion]:
        """``_generate_group`` through the static decoder: the same prompts, processors, stop
        tokens and seed as ``generate``, so the same completions."""
        import torch

        from kgsynth.llm.static_decode import DecodeParams

        p = reqs[0].params
        gen = self._model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self._tok.eos_token_id
        sampling = p.temperature > 0
        params = DecodeParams(
            max_new_tokens=p.max_tokens,
            temperature=p.temperature if sampling else 0.0,
            top_p=p.top_p if sampling and p.top_p is not None else 1.0,
            top_k=(50 if gen.top_k is None else gen.top_k) if sampling else 0,
            stop_ids=frozenset([eos] if isinstance(eos, int) else (eos or [])),
            stop_strings=tuple(p.stop),
        )
        prompts = [self._tok(self._prompt(r), add_special_tokens=False)["input_ids"] for r in reqs]
        if p.seed is not None:
            torch.manual_seed(p.seed)
        results = []
        for ids, out in zip(prompts, decoder.generate(prompts, params), strict=True):
            text = self._tok.decode(out.ids, skip_special_tokens=True)
            for stop in p.stop:  # keep the stop string, drop anything after it
                cut = text.find(stop)
                if cut >= 0:
                    text = text[: cut + len(stop)]
            n_new = len(out.ids)
            results.append(
                Completion(
                    clean_text(text),
                    finish_reason="stop" if n_new < p.max_tokens else "length",
                    prompt_tokens=len(ids),
                    completion_tokens=n_new,
                )
            )
        return results

    def _generate_safe(self, reqs: Sequence[Request]) -> list[Completion]:
        decoder = self._static()
        try:
            if decoder is not None:
                return self._generate_static(decoder, reqs)
            return self._generate_group(reqs)
        except (RuntimeError, ValueError) as exc:
            return [Completion("", error=f"hf generate failed: {exc}"[:500])] * len(reqs)

    def _in_workers(self) -> bool:
        """Whether batches go to worker processes: ``workers`` > 1 on a CPU device, where
        ``generate`` runs. The static engine instead decodes in this process on every core:
        one process with two threads answered the 300 dev questions of `make all`'s eval in
        16.2 s against 24.9 s for two single-thread workers (each imports and loads the model,
        and the batches wait for the slower one; benchmarks/README.md, "Eval in 15 s")."""
        if self.workers == 1:
            return False
        if self._resolve_device() != "cpu":
            log.warning("--workers %d: generation on %s stays in one process", self.workers,
                        self.device)  # fmt: skip
            self.workers = 1
            return False
        if self._pool is None and self.engine != "hf":
            self._load()
            if self._static() is not None:
                self._every_core = True
                return False
        if self._pool is None:
            import multiprocessing
            import os
            from concurrent.futures import ProcessPoolExecutor

            threads = max(1, (os.cpu_count() or 1) // self.workers)
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_start,
                initargs=(self.model, threads),
            )
        return True

    def generate_batch(
        self, requests: Sequence[Request], progress: ProgressFn | None = None
    ) -> list[Completion]:
        pooled = self._in_workers()
        if not pooled:
            self._load()
        out: list[Completion | None] = [None] * len(requests)
        # group by parameters so one generate() call serves a batch
        groups: dict[Any, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(r.params, []).append(i)
        chunks = [
            idxs[start : start + self.batch_size]
            for idxs in groups.values()
            for start in range(0, len(idxs), self.batch_size)
        ]
        if pooled:
            futures = [
                self._pool.submit(_worker_generate, [requests[i] for i in c]) for c in chunks
            ]
            results = (f.result() for f in futures)
        else:
            results = (self._generate_safe([requests[i] for i in c]) for c in chunks)
        with all_cores() if self._every_core else contextlib.nullcontext():
            for chunk, done in zip(chunks, results, strict=True):
                for i, c in zip(chunk, done, strict=True):
                    out[i] = c
                    self.stats.add(c)
                    if progress:
                        progress(i, c)
        return [c for c in out if c is not None]

    def close(self) -> None:
        self._model = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


_WORKER: HFLLM | None = None  # the model a worker process generates with


def _worker_start(model: str, threads: int) -> None:
    import torch

    from kgsynth.core.cores import worker_ignores_interrupts

    global _WORKER
    worker_ignores_interrupts()
    torch.set_num_threads(threads)
    _WORKER = HFLLM(model, device="cpu")
    _WORKER._load()


def _worker_generate(reqs: list[Request]) -> list[Completion]:
    assert _WORKER is not None
    return _WORKER._generate_safe(reqs)
