"""Build a tiny openai-whisper checkpoint for tests, offline, in about a second: it says a known phrase.

The checkpoint is the format ``whisper.load_model(path)`` reads (``{"dims", "model_state_dict"}``) with real
``ModelDimensions`` (80 mel bins, 1500 audio frames, the English tokenizer's 51,864 tokens) but one narrow layer
each. Its decoder is wired rather than trained: every block's output projections are zero, so the residual stream
is just token + position embeddings, and the position embeddings point at the tokens of ``<|start|>phrase<|end|>``.
So for any non-silent audio, ``transcribe`` returns one segment, ``start_s``-``end_s``, reading ``phrase``; the
whole real decoding path (mel spectrogram, encoder, timestamp rules, segment building) runs. Needs openai-whisper.
"""

from __future__ import annotations

from pathlib import Path

TIMESTAMP_STEP_S = 0.02  # Whisper's timestamp token resolution


def build_tiny_whisper(path: str | Path, phrase: str = "the harbour lights were green", start_s: float = 0.0,
                       end_s: float = 1.0) -> Path:
    """Write the checkpoint to ``path`` (a ``.pt`` file; parents created); returns ``path``."""
    import torch
    from whisper.model import ModelDimensions, Whisper
    from whisper.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(multilingual=False)
    stamp = lambda s: tokenizer.timestamp_begin + round(s / TIMESTAMP_STEP_S)  # noqa: E731
    script = [stamp(start_s), *tokenizer.encode(" " + phrase.strip()), stamp(end_s), tokenizer.eot]
    dims = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=32, n_audio_head=1, n_audio_layer=1,
                           n_vocab=51864, n_text_ctx=64, n_text_state=32, n_text_head=1, n_text_layer=1)
    distinct = list(dict.fromkeys(script))
    if len(distinct) > dims.n_text_state or len(script) + 1 > dims.n_text_ctx:
        raise ValueError(f"phrase too long for the tiny model: {len(script)} tokens")
    torch.manual_seed(0)
    model = Whisper(dims)
    with torch.no_grad():
        decoder = model.decoder
        decoder.token_embedding.weight.normal_(0.0, 0.01)
        for axis, token in enumerate(distinct):  # each scripted token gets its own axis
            decoder.token_embedding.weight[token].zero_()
            decoder.token_embedding.weight[token, axis] = 10.0
        decoder.positional_embedding.zero_()
        first = len(tokenizer.sot_sequence) - 1  # the position that predicts the first sampled token
        for offset, token in enumerate(script):
            decoder.positional_embedding[first + offset, distinct.index(token)] = 1000.0
        for block in decoder.blocks:
            for layer in (block.attn.out, block.cross_attn.out, block.mlp[2]):
                layer.weight.zero_()
                layer.bias.zero_()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"dims": dims.__dict__, "model_state_dict": model.state_dict()}, target)
    return target
