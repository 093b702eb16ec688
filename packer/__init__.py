"""packer: tokenize corpora, pack documents into fixed context windows, write verifiable shards,
and load them with exact per-document attention.

    import packer
    packer.build(packer.load_job("pipelines/sample.toml"))     # or packer.Job(...)
    ds = packer.open_dataset("out/sample")                      # ds[i] -> (tokens, offsets)

The names below load on first use, so `import packer` stays cheap and never imports torch.
"""

from packer._version import __version__

_LAZY = {
    "BuildConfig": "packer.config",
    "Job": "packer.config",
    "load_job": "packer.config",
    "open_dataset": "packer.store.dataset",
    "read_manifest": "packer.store.manifest",
    "pack": "packer.binpack",
    "lower_bound": "packer.binpack",
}

__all__ = ["BuildConfig", "Job", "build", "load_job", "lower_bound", "open_dataset", "pack", "read_manifest",
           "__version__"]


def build(job, **kwargs):
    """Run a whole build (packer/preprocess/pipeline.py): tokenize -> plan -> write -> finalize -> publish."""
    from packer.preprocess.pipeline import build as run

    return run(job, **kwargs)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'packer' has no attribute {name!r}")
