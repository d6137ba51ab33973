"""Build a tiny, randomly initialised CLIP model directory for tests, offline, in well under a second.

It has the layout of the published ``sentence-transformers/clip-ViT-B-32`` (``modules.json`` pointing at a
``0_CLIPModel`` folder with a transformers ``CLIPModel``, ``vocab.json``/``merges.txt`` and a
``preprocessor_config.json``), so the plugin's real loading path is what the tests exercise; only the sizes differ
(32x32 pixel input, 16-dim vectors, a character-level tokenizer). Its vectors carry no meaning.
Needs ``transformers`` and ``tokenizers`` (both come with sentence-transformers).
"""

from __future__ import annotations

import json
from pathlib import Path

#: output size of the tiny model
TINY_DIM = 16


def build_tiny_clip(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny CLIP sentence-transformers model directory at ``path`` (created); returns ``path``."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import CLIPConfig, CLIPModel

    root = Path(path)
    module = root / "0_CLIPModel"
    module.mkdir(parents=True, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for suffix in ("", "</w>"):
        for char in alphabet:
            vocab[char + suffix] = len(vocab)
    config = CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 77, "bos_token_id": 0, "eos_token_id": 1,
                     "pad_token_id": 1},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=TINY_DIM,
    )
    torch.manual_seed(seed)
    CLIPModel(config).eval().save_pretrained(module)
    (module / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (module / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    (module / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "CLIPTokenizer", "model_max_length": 77, "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}), encoding="utf-8")
    (module / "preprocessor_config.json").write_text(json.dumps({
        "crop_size": 32, "do_center_crop": True, "do_normalize": True, "do_resize": True,
        "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 32}), encoding="utf-8")
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"}]),
        encoding="utf-8")
    return root
