"""packer: tokenize corpora, pack documents into fixed context windows, write verifiable shards,
and load them with exact per-document attention."""

__version__ = "0.1.0"

from packer.binpack import lower_bound, pack  # noqa: E402
from packer.config import BuildConfig, Job, load_job  # noqa: E402
from packer.shards import open_dataset, read_manifest  # noqa: E402

__all__ = ["BuildConfig", "Job", "load_job", "lower_bound", "open_dataset", "pack", "read_manifest", "__version__"]
