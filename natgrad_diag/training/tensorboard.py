"""The monitor's TensorBoard scalars: ``tf.summary.write`` with the scalar plugin's metadata writes what
``tf.summary.scalar`` writes, without the tensorboard package. A tag is written once per step (a second value for the
same (tag, step) is dropped); the periodic checks write ``natgrad/check/...``."""

from __future__ import annotations

import os
from typing import Any

from natgrad_diag._validate import input_error
from natgrad_diag.training.records import GuardRecord, NatGradRecord

__all__ = ["SCALARS", "ScalarLog", "log_directory"]

#: Every scalar the monitor writes, under these tags.
SCALARS = (
    "natgrad/loss_before", "natgrad/loss_after", "natgrad/gamma", "natgrad/rollbacks", "natgrad/step_failed",
    "natgrad/check/loss_before", "natgrad/check/loss_after", "natgrad/check/reproduction_error",
    "natgrad/check/suggested_gamma",
)  # fmt: skip


def log_directory(log_dir: Any) -> str:
    """``log_dir`` (a str or os.PathLike) as a path, the directory created (with its parents) when missing.

    Raises:
        InputError: naming ``log_dir``: not a path, an existing file, or a directory that cannot be created.
    """
    if not isinstance(log_dir, (str, os.PathLike)) or not str(log_dir):
        raise input_error("log_dir must be a directory path.", "log_dir", "a str or os.PathLike", repr(log_dir),
                          "pass a folder for TensorBoard's event files, e.g. log_dir='logs/natgrad'.")  # fmt: skip
    path = os.fspath(log_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise input_error("log_dir is an existing file, not a directory.", "log_dir", "a directory (existing or new)",
                          repr(path), "pass a folder for TensorBoard's event files, not a file.")  # fmt: skip
    try:
        os.makedirs(path, exist_ok=True)
    except (OSError, ValueError) as e:  # ValueError: a null byte in the path
        raise input_error(f"log_dir could not be created: {getattr(e, 'strerror', None) or e}.", "log_dir", "a directory that can be written",
                          repr(path), "pass a folder you can write to.") from e  # fmt: skip
    return str(path)


class ScalarLog:
    """A ``tf.summary`` file writer in ``log_dir`` (opened on first use), the rollbacks counted so far and the last
    step written under each tag."""

    def __init__(self, log_dir: Any) -> None:
        self.log_dir, self.rollbacks = log_directory(log_dir), 0
        self._writer: Any = None
        self._last_step: dict[str, int] = {}

    def _write(self, step: int, values: dict[str, float | None]) -> None:
        import tensorflow as tf
        from tensorflow.core.framework.summary_pb2 import SummaryMetadata

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
        with self._writer.as_default():
            for tag, value in values.items():
                if value is not None and self._last_step.get(tag) != int(step):
                    self._last_step[tag] = int(step)  # float32, as tf.summary.scalar writes (the scalar plugin reads it)
                    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=int(step), metadata=metadata)
        self._writer.flush()

    def record(self, step: int, record: NatGradRecord) -> None:
        """The periodic check's numbers: loss before and after the checked step, reproduction error, suggested γ."""
        self._write(step, {"natgrad/check/loss_before": record.loss, "natgrad/check/loss_after": record.loss_after,
                           "natgrad/check/reproduction_error": record.reproduction_error,
                           "natgrad/check/suggested_gamma": record.suggested_gamma})  # fmt: skip

    def guard(self, record: GuardRecord) -> None:
        """A guarded step: the losses, γ in use after it, the rollbacks so far and whether it failed."""
        self.rollbacks += int(record.rolled_back)
        self._write(record.step, {"natgrad/loss_before": record.loss_before, "natgrad/loss_after": record.loss_after,
                                  "natgrad/gamma": record.gamma_after, "natgrad/rollbacks": self.rollbacks,
                                  "natgrad/step_failed": float(not record.passed)})  # fmt: skip

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
