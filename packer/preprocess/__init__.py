"""The preprocessing side: inputs -> readers -> tokenize -> plan -> write -> finalize -> publish. Never imports torch.

`packer.build(job)` (packer/__init__.py) runs a whole build: pipeline.build.
"""
