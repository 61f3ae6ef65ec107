"""The `data_streaming` resolver of configs/data/streaming.yaml: a streamed folder's shapes, from its shapes.json.

Apart from streaming.py so that composing a config never imports litdata (an optional dependency).
"""

import importlib.util
import json
from pathlib import Path

from ..errors import ConfigError
from .files import described_field

SHAPES_FILE = "shapes.json"  # in a data=streaming folder: num_features, sample_shape, num_classes, splits


def streamed_shapes(dir: str | None, key: str) -> object:
    """The `data_streaming` resolver: ${data_streaming:DIR,num_features|sample_shape|num_classes|splits}, read from
    DIR/shapes.json (written by the conversion, streaming.py). A bucket's is not read: give them on the command line.
    Also where a missing litdata (an optional dependency) is reported, before anything is built."""
    convert = "python -m {{ cookiecutter.package_name }}.data.streaming FILES_DIR DIR"
    if importlib.util.find_spec("litdata") is None:
        raise ConfigError(
            "data=streaming needs litdata: pip install -e '.[streaming]' && pip install --no-deps "
            "'litdata>=0.2.70,<0.3' (with its dependencies it would pull torchvision and another torch build)"
        )
    if not dir:
        raise ConfigError(f"data.dir is not set: data=streaming data.dir=DIR, DIR written by {convert}")
    if "://" in dir:
        raise ConfigError(
            f"data.{key} is not read from {dir}: give data.num_features, data.num_classes and data.splits (from its "
            f"{SHAPES_FILE}) on the command line"
        )
    path = Path(dir).expanduser() / SHAPES_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: not found; data=streaming reads a folder written by {convert}")
    return described_field(json.loads(path.read_text()), "data_streaming", key)
