"""Moved to :mod:`detaug.keras.data` (``tf.data`` and Grain views of a sequence); this name stays importable."""

from detaug.keras.data import GrainBatchSource, element_spec, to_tf_dataset

__all__ = ["GrainBatchSource", "element_spec", "to_tf_dataset"]
