"""Audio for qmd-indexer: a classifier and an extractor (``audio``) that turn recordings into transcript chunks.

- ``audio`` classifier: ``.mp3 .wav .ogg .opus .m4a .aac .flac`` are kind ``"audio"``; the workspace's
  ``multimodal`` settings decide whether they are indexed.
- ``audio`` extractor: the content must confirm the name (magic bytes); the file is decoded in-process to 16 kHz
  mono float32 (soundfile; PyAV or the ``ffmpeg`` command only for what soundfile cannot read), its voiced
  stretches (Silero VAD) are transcribed by a Whisper engine, segments that fail Whisper's thresholds or hold only
  punctuation are dropped (``qmd_indexer_audio.speech``), and the rest become text chunks (``kind="audio"``,
  ``modality="text"``) with ``start_s`` and ``end_s`` in seconds, embedded by the text embedder like notes. A
  recording without speech is skipped (``silent``/``no_speech``) and that verdict is remembered by content
  (``qmd_indexer_audio.verdicts``).

Config ``[plugin.audio]``: see ``qmd_indexer_audio.extract``.
"""

__version__ = "0.1.0"
