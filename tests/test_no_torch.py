"""The checker, `explain`, `rules` and `env` must work on a machine without torch (pre-commit, CI lint jobs,
a laptop reading a log). Each command runs in a fresh interpreter where importing torch (or a library that
needs it) fails, as it would if torch were not installed, and must not even try."""

import subprocess
import sys
import textwrap

import pytest

BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = ("torch", "lightning", "pytorch_lightning", "accelerate", "torchmetrics")
    attempts = []
    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                attempts.append(name)
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, NoTorch())
    from ddpdoctor.cli import main
    try:
        rc = main(sys.argv[1:])
    except SystemExit as exc:
        rc = exc.code
    print("IMPORT-ATTEMPTS:", sorted(set(attempts)), file=sys.stderr)
    sys.exit(rc)
""")

BROKEN_MODEL = textwrap.dedent("""
    import lightning.pytorch as pl

    class Model(pl.LightningModule):
        def on_validation_epoch_end(self):
            if self.trainer.is_global_zero:
                self.log("val_metric", 1.0, sync_dist=True)
""")

LOG = textwrap.dedent("""
    [rank0]: Traceback (most recent call last):
    [rank0]:   File "/work/train.py", line 9, in <module>
    [rank0]:     dist.all_reduce(torch.ones(1))
    [rank0]: RuntimeError: No backend type associated with device type cpu
""")


def run_without_torch(*args, stdin=None):
    return subprocess.run([sys.executable, "-c", BLOCKER, *args], capture_output=True, text=True, timeout=60,
                          input=stdin)


def assert_no_torch_import(result):
    assert "IMPORT-ATTEMPTS: []" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["rules"], ["rules", "F1"], ["rules", "DDP101"], ["--help"]])
def test_docs_commands_without_torch(args):
    result = run_without_torch(*args)
    assert result.returncode == 0, result.stderr
    assert_no_torch_import(result)


def test_check_without_torch(tmp_path):
    source = tmp_path / "model.py"
    source.write_text(BROKEN_MODEL)
    result = run_without_torch("check", str(source))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DDP101" in result.stdout
    assert_no_torch_import(result)


def test_explain_without_torch():
    result = run_without_torch("explain", "-", stdin=LOG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "backend-device-mismatch" in result.stdout
    assert_no_torch_import(result)


def test_env_without_torch():
    result = run_without_torch("env")
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "torch" in result.stdout
