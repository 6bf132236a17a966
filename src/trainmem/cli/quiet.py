"""Libraries' start-up noise kept off stderr unless --debug: TensorFlow's C++ start-up lines and the Hugging Face
libraries' deprecation warnings. trainmem's own lines (errors, `warning:` lines, environment notes) never pass
through here.

TensorFlow 2.21 logs through absl. Measured on tensorflow-cpu 2.21.0 (`python -c "import tensorflow"`):
TF_CPP_MIN_LOG_LEVEL, set before the first import, removes the lines TensorFlow logs once its logging is set up
(cpu_feature_guard.cc's "This TensorFlow binary is optimized…" and its "To enable the following instructions"
line at 1 and above), but not the oneDNN line of util/port.cc ("oneDNN custom operations are on…") nor absl's
"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR": both come from static
initializers while a shared library is loaded, before that level is read, once for libtensorflow_framework.so.2
and once for _pywrap_profiler_plugin.so (each carries its own copy), so a Keras answer began with four lines.
Neither TF_CPP_MAX_VLOG_LEVEL, ABSL_MIN_LOG_LEVEL (absl's is a compile-time macro), GLOG_minloglevel nor
TF_ENABLE_ONEDNN_OPTS=1 removes them (TF_ENABLE_ONEDNN_OPTS=0 would, by turning oneDNN off: a different run).
So the first `import tensorflow` of the process — by trainmem (frontends/keras/imports.py), Keras or the user's
own factory file — runs with file descriptor 2 captured; what TensorFlow wrote there comes back without the
absl-format records below TF_CPP_MIN_LOG_LEVEL (2 where the user set none, as imports.py sets it) and without
absl's notice; everything else it wrote (a Python warning, an error record) comes back as written.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import signal
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LOG_LEVEL = "2"  # errors and fatal records only: TensorFlow's INFO and WARNING start-up records go
# absl's record header: severity letter, MMDD, time (before absl is initialised "00:00:<epoch seconds>"),
# thread id, file:line]
ABSL_RECORD = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\s\]]+:\d+\] ")
SEVERITIES = "IWEF"  # TF_CPP_MIN_LOG_LEVEL's scale: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL
ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# the second line of cpu_feature_guard.cc's record (the one record of the start-up written over two lines)
CONTINUATIONS = ("To enable the following instructions:",)
# the Hugging Face libraries trainmem drives (transformers builds hf: models, peft adds LoRA): their
# FutureWarning/DeprecationWarning/UserWarning notices concern their own next releases, not the estimate
HF_MODULES = r"(transformers|peft|huggingface_hub|accelerate)(\.|$)"
HF_CATEGORIES = (FutureWarning, DeprecationWarning, UserWarning)


@contextlib.contextmanager
def libraries_quiet(debug: bool) -> Iterator[None]:
    """While a command runs: TensorFlow's first import filtered and the Hugging Face warnings ignored, unless
    `debug` or Python's own warning options (-W, PYTHONWARNINGS: the user chose what to see)."""
    if debug:
        yield
        return
    finder = _QuietTensorflowImport()
    sys.meta_path.insert(0, finder)
    try:
        with warnings.catch_warnings():
            if not sys.warnoptions:
                for category in HF_CATEGORIES:
                    warnings.filterwarnings("ignore", category=category, module=HF_MODULES)
            yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


def kept_lines(text: str, min_level: int) -> str:
    """`text` (what TensorFlow's import wrote on stderr) without absl records below `min_level`, their
    continuation lines, and absl's notice about messages before InitializeLog (where INFO records are dropped)."""
    kept, dropping = [], False
    for line in text.splitlines(keepends=True):
        record = ABSL_RECORD.match(line)
        if record:
            dropping = SEVERITIES.index(record.group(1)) < min_level
        elif line.startswith(ABSL_NOTICE):
            dropping = min_level > 0
        elif not (dropping and line.startswith(CONTINUATIONS)):
            dropping = False
        if not dropping:
            kept.append(line)
    return "".join(kept)


def min_log_level() -> int:
    """TF_CPP_MIN_LOG_LEVEL as TensorFlow reads it: a whole number, 0 (everything) where it is not one."""
    try:
        return int(os.environ.get(LOG_LEVEL_VARIABLE, "0").strip())
    except ValueError:
        return 0


class _QuietTensorflowImport(importlib.abc.MetaPathFinder):
    """The first import of `tensorflow` in the process, found as usual and executed with stderr filtered;
    it takes itself off sys.meta_path at once, so every later import is Python's own."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "tensorflow":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        os.environ.setdefault(LOG_LEVEL_VARIABLE, QUIET_LOG_LEVEL)  # before TensorFlow's logging reads it
        spec.loader = _FilteredLoader(spec.loader)
        return spec


class _FilteredLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            with stderr_filtered(min_log_level()):
                self.loader.exec_module(module)
        finally:  # the module keeps the loader that really loaded it
            module.__loader__ = self.loader
            if module.__spec__ is not None:
                module.__spec__.loader = self.loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


@contextlib.contextmanager
def stderr_filtered(min_level: int) -> Iterator[None]:
    """File descriptor 2 captured for the block (C++ writes it directly), then written back through
    `kept_lines`. Ctrl-C puts the descriptor back before the handler that reports it runs."""
    if min_level <= 0:
        yield
        return
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter (closed): nothing would be seen anyway
        yield
        return
    captured = tempfile.TemporaryFile()
    os.dup2(captured.fileno(), 2)
    restore = lambda: os.dup2(saved, 2)  # noqa: E731
    with _restoring_on_interrupt(restore):
        try:
            yield
        finally:
            with contextlib.suppress(AttributeError, OSError, ValueError):
                sys.stderr.flush()
            restore()
            os.close(saved)
            captured.seek(0)
            text = kept_lines(captured.read().decode("utf-8", "replace"), min_level)
            captured.close()
            if text:
                with contextlib.suppress(OSError):
                    os.write(2, text.encode("utf-8", "replace"))


@contextlib.contextmanager
def _restoring_on_interrupt(restore) -> Iterator[None]:
    """SIGINT during the block: `restore` first, then the handler that was there (the CLI's writes its line to
    descriptor 2 and exits at once, cli/process.py)."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler not installed from Python: it cannot be put back, so leave it alone
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        restore()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

    from trainmem.cli.process import sigint_handled_by

    with sigint_handled_by(handler):
        yield
