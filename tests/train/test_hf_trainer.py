"""examples/hf_trainer.py (transformers.Trainer + packer.hf.PackedTrainer) and examples/hf_accelerate.py (a plain
accelerate loop over packer.hf.hf_dataloader), run as a user runs them, in 1 process and in 2 under torchrun
(gloo, CPU): over one epoch every packed row is trained exactly once across ranks, each rank trains its own
share (no rank starves, accelerate does not split again), ranks take the same number of steps, and the first
step's loss equals the per-document loss of the rows it trained.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch.nn.functional as F  # noqa: E402
from conftest import ROOT  # noqa: E402
from test_hf import build_small  # noqa: E402

from packer.store.dataset import open_dataset  # noqa: E402

EXAMPLES = ROOT / "examples"
BATCH = 6  # 37 rows: 2 ranks own 19 and 18, so rank 0's last row joins its third batch (a batch of 7)


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    return build_small(tmp_path_factory.mktemp("hf-trainer") / "ds")


def _run(script: str, n_proc: int, args: list[str], cwd):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    launcher = [sys.executable] if n_proc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                     f"--nproc_per_node={n_proc}"]
    returncode, stderr = run_torchrun(launcher + [str(EXAMPLES / script)] + args, cwd=cwd, env=env)
    assert returncode == 0, stderr[-4000:]


def run_torchrun(command: list[str], timeout: float = 240, **kwargs) -> tuple[int, str]:
    """(returncode, output) of a launcher run: its stdout and stderr and its ranks' (they inherit both), in order.
    Past `timeout` the test fails with where every process hung: py-spy's native and Python stacks of the
    launcher and each rank (a hang inside a C++ destructor shows only there; py-spy where installed), then the
    SIGABRT that makes faulthandler print their Python stacks, then SIGKILL, so no rank is left running."""
    env = {**kwargs.pop("env", os.environ), "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               **kwargs)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = [process.pid, *_descendants(process.pid)]  # the ranks run in sessions of their own: no killpg
        stacks = _native_stacks(tree)
        for sig in (signal.SIGABRT, signal.SIGKILL):
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in tree[1:]):
                time.sleep(0.1)
        output, _ = process.communicate()
        pytest.fail(f"hung past {timeout} s; the output of the launcher and its ranks (faulthandler's Python stacks "
                    f"last):\n{output[-8000:]}\n{stacks}")
    return process.returncode, output


def _native_stacks(pids: list[int]) -> str:
    """`py-spy dump --native` of each process, bare addresses left out; a line saying why where it cannot."""
    if shutil.which("py-spy") is None:
        return "(py-spy is not installed: no native stacks)"
    dumps = []
    for pid in pids:
        try:
            done = subprocess.run(["py-spy", "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                                  timeout=30)
            text = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            text = "py-spy timed out"
        lines = [line for line in text.splitlines() if not line.strip().startswith("0x")]
        dumps.append(f"--- py-spy, pid {pid}:\n" + "\n".join(lines))
    return "\n".join(dumps)


def _descendants(pid: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [c for c, p in parents.items() if p == parent]
        out += children
        todo += children
    return out


def _py_spy_reads_a_child() -> bool:
    """Whether py-spy may read a process here (a container without ptrace rights refuses it)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        return subprocess.run(["py-spy", "dump", "--pid", str(child.pid)], capture_output=True, timeout=30).returncode == 0
    finally:
        child.kill()
        child.wait()


HANGS = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import os, time; print('rank up', os.getpid(), flush=True); time.sleep(600)"],
                 start_new_session=True)  # as torchrun starts its ranks
print('launcher up', flush=True)
time.sleep(600)
"""


def test_a_hung_launcher_fails_with_every_process_output_and_stacks_and_leaves_none_running(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    with pytest.raises(pytest.fail.Exception) as failed:
        run_torchrun([sys.executable, str(tmp_path / "hangs.py")], timeout=3)
    message = str(failed.value)
    assert "hung past 3 s" in message and "launcher up" in message and "rank up" in message
    assert message.count("Fatal Python error: Aborted") == 2  # faulthandler, in the launcher and in its rank
    if shutil.which("py-spy"):  # each process's dump, or py-spy's reason where it may not read them (no ptrace)
        assert message.count("--- py-spy, pid") == 2
        assert "<module> (hangs.py:" in message or not _py_spy_reads_a_child()
    rank = int(message.split("rank up ")[1].split()[0])
    stat = Path(f"/proc/{rank}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # killed (a zombie at most)


def _example_module():
    spec = importlib.util.spec_from_file_location("hf_trainer_example", EXAMPLES / "hf_trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_end_process_group_refuses_while_a_ddp_model_is_alive(tmp_path):
    """A live DDP model's Reducer would hold the group's last reference and join gloo's threads with the GIL held,
    the hang that end_process_group's docstring tells: it refuses, and closes the group once the model is gone."""
    end_process_group = _example_module().end_process_group
    torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(str(tmp_path / "store"), 1),
                                         rank=0, world_size=1)
    models = [torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))]
    try:
        models[0](torch.ones(1, 2)).sum().backward()  # one step: the Reducer has run its collective
        with pytest.raises(RuntimeError, match="DistributedDataParallel model is still alive; del the trainer"):
            end_process_group()
        assert torch.distributed.is_initialized()
        models.clear()
        end_process_group()
        assert not torch.distributed.is_initialized()
    finally:
        models.clear()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def per_document_loss(data, rows: list[int]) -> float:
    """The example's model (its seed, before any step), each document of these rows run alone: token-weighted loss."""
    model = _example_module().tiny_model(data, seed=0)
    stored = open_dataset(data)
    loss_sum, n_tokens = 0.0, 0
    with torch.no_grad():
        for r in rows:
            tokens, offsets = stored[r]
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
                doc = torch.from_numpy(tokens[a:b].astype("int64"))
                logits = model(input_ids=doc[None], use_cache=False).logits[0].double()
                loss_sum += F.cross_entropy(logits[:-1], doc[1:], reduction="sum").item()
                n_tokens += b - a - 1
    return loss_sum / n_tokens


@pytest.mark.parametrize("n_proc", [1, 2])
@pytest.mark.parametrize("script", ["hf_trainer.py", "hf_accelerate.py"])
def test_one_epoch_every_row_once(small_dataset, tmp_path, script, n_proc):
    n_rows = len(open_dataset(small_dataset))
    shares = [len(range(r, n_rows, n_proc)) for r in range(n_proc)]  # PackedDataset's rank split
    steps_per_epoch = -(-shares[-1] // BATCH)
    _run(script, n_proc, ["--data", str(small_dataset), "--max-steps", str(steps_per_epoch), "--batch-size",
                          str(BATCH), "--rows-seen", str(tmp_path / "rows"), "--loss-log", str(tmp_path / "loss")],
         tmp_path)
    rows = [[int(line) for line in (tmp_path / f"rows.rank{r}").read_text().split()] for r in range(n_proc)]
    steps = [[json.loads(line) for line in (tmp_path / f"loss.rank{r}").read_text().splitlines()]
             for r in range(n_proc)]
    assert sorted(sum(rows, [])) == list(range(n_rows))  # each row once over the ranks
    assert [len(r) for r in rows] == shares  # each rank its own share: no starving, no second split
    assert [len(s) for s in steps] == [steps_per_epoch] * n_proc  # ranks in lockstep
    assert [sum(s["rows"] for s in rank) for rank in steps] == shares
    if n_proc == 2:
        assert [s["rows"] for s in steps[0]] == [6, 6, 7] and [s["rows"] for s in steps[1]] == [6, 6, 6]
    first_rows = sum((rank_rows[:rank_steps[0]["rows"]] for rank_rows, rank_steps in zip(rows, steps)), [])
    first_loss = sum(rank[0]["loss"] for rank in steps) / n_proc  # each rank's share x world: their mean
    assert abs(first_loss - per_document_loss(small_dataset, first_rows)) < 2e-5


MISMATCH = """
import sys
from transformers import TrainingArguments
from packer.data import PackedDataset
from packer.hf import PackedTrainer
sys.path.insert(0, sys.argv[2])
from hf_trainer import end_process_group, tiny_model

args = TrainingArguments(output_dir=sys.argv[3], max_steps=1, report_to="none")  # no use_cpu on a CPU box
assert args.world_size == 1
trainer = PackedTrainer(model=tiny_model(sys.argv[1]), args=args, train_dataset=PackedDataset(sys.argv[1]))
try:
    trainer.get_train_dataloader()
except ValueError as e:
    assert "use_cpu=True" in str(e), e
else:
    raise AssertionError("2 processes trained as 2 separate runs")
end_process_group()
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the trap is accelerate's CPU default")
def test_trainer_refuses_ranks_that_would_train_separately(small_dataset, tmp_path):
    """On CPU, TrainingArguments without use_cpu=True under torchrun: the process group is up, but accelerate
    runs each rank as a run of its own (world_size 1). PackedTrainer stops instead of training 2 models."""
    (tmp_path / "mismatch.py").write_text(MISMATCH)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    returncode, stderr = run_torchrun([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc_per_node=2", str(tmp_path / "mismatch.py"), str(small_dataset),
                                       str(EXAMPLES), str(tmp_path / "out")], env=env)
    assert returncode == 0, stderr[-4000:]
