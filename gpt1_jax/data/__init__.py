"""Pre-training data: text sources -> GPT-1 BPE token cache -> packed windows -> per-process batches.

    from gpt1_jax.data import DataConfig, build_pipeline
    data = build_pipeline(DataConfig(source="default", seq_len=512), workdir="runs/x")
    it = data.train_iter()            # this process's rows of every global batch
    batch = next(it); state = it.state()   # JSON-able; it.restore(state) resumes exactly

Modules: ``sources`` (documents from pydoc/files/tfds), ``tfds_text`` (tfds without TensorFlow),
``tokens`` (tokenizer choice, end-of-document id, on-disk token cache), ``once`` (the cache and a
trained BPE built by one process while the others wait: process 0 of a job, a lock across jobs;
``gpt1-jax tokenize`` builds them ahead), ``pipeline`` (packing, split, iterator, global arrays),
``bench`` (``python -m gpt1_jax.data``: throughput, JSON lines). Fine-tuning data: ``glue`` and ``race``
(the tasks' examples), ``layout`` (the token layout of the heads' inputs), ``tasks`` (both as padded batches).
"""

from gpt1_jax.data.pipeline import (
    BatchIterator,
    DataConfig,
    DataPipeline,
    PackedWindows,
    build_pipeline,
    default_cache_dir,
    split_windows,
)
from gpt1_jax.data.sources import FileSource, PydocSource, TextSource, open_source, read_blocks
from gpt1_jax.data.tokens import TokenStream, eod_id, tokenize_to_cache, tokenizer_for

__all__ = [
    "BatchIterator",
    "DataConfig",
    "DataPipeline",
    "FileSource",
    "PackedWindows",
    "PydocSource",
    "TextSource",
    "TokenStream",
    "build_pipeline",
    "default_cache_dir",
    "eod_id",
    "open_source",
    "read_blocks",
    "split_windows",
    "tokenize_to_cache",
    "tokenizer_for",
]
