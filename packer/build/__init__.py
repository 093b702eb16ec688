"""The preprocessing side: inputs -> readers -> tokenize -> plan -> write -> finalize. Never imports torch.

`packer.build(job)` runs a whole build (packer/build/pipeline.py): this package is callable, so the
public name and the folder are one thing.
"""

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, job, **kwargs):
        from packer.build.pipeline import build

        return build(job, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
