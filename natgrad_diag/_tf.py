"""TensorFlow imported quietly: its C++ start-up lines (absl, oneDNN, CUDA probing) kept off stderr.

TensorFlow 2.21 writes 7-9 lines to file descriptor 2 on import and device initialisation, from C++, before
``TF_CPP_MIN_LOG_LEVEL`` applies to all of them; they are dropped on success and replayed before the error on failure.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile

__all__ = ["import_tensorflow_quietly"]


def import_tensorflow_quietly(*, force: bool = False) -> None:
    """Import TensorFlow (and initialise its devices) with descriptor 2 pointed at a temporary file.

    Does nothing when TensorFlow is already imported, or (unless ``force``, the CLI's own runs) when the user asked
    for TensorFlow's logs (``TF_CPP_MIN_LOG_LEVEL=0``). Python-level TensorFlow logging is set to errors only, unless
    already configured.
    """
    if "tensorflow" in sys.modules or (os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0" and not force):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # 3: also the E-level notes of ops (oneDNN, cuInit)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow

            tensorflow.constant(0.0) + 0.0  # device initialisation logs here too
        except BaseException as e:
            os.dup2(saved, 2)
            if not isinstance(e, KeyboardInterrupt):  # Ctrl-C is no failure to explain
                sink.seek(0)
                sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    tf_logger = logging.getLogger("tensorflow")
    if tf_logger.level == logging.NOTSET:
        tf_logger.setLevel(logging.ERROR)
