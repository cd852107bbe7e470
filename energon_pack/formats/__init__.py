"""The dataset formats energon_pack reads in place, ours among them: one module per format, each
turning a stored sample into our record form (``core.samples.QwenVLChatSample``), and the dispatch
(``formats.dispatch``) that picks the reader from a dataset's own ``.nv-meta/dataset.yaml``."""
