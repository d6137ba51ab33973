"""The plugins that ship with qmd-indexer, registered through the same entry points a third-party package uses
(``pyproject.toml``): the ``markdown`` classifier and extractor, the ``sentence-transformers`` and ``openai`` text
embedders, the ``cross-encoder`` and ``http`` rerankers. Nothing in the core imports them by name to run them; the
daemon finds them through ``indexer.plugins`` like any other plugin.

Beside them are the modules only they use: the text model's files and precision (``text_model``), its ONNX exports
and the sessions they run on (``onnx_models``, ``onnx_runtime``), and HTTP to a model server (``remote``). What any
plugin may use is ``indexer.api``'s, which imports nothing from here.
"""
