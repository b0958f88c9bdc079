"""What a meta-path finder that only watches imports needs: the spec the other finders give."""

from __future__ import annotations

import sys
from typing import Any


def spec_from_other_finders(finder: object, name: str, path: Any = None, target: Any = None) -> Any:
    """The spec the finders of `sys.meta_path` other than `finder` give for `name`, or None."""
    for other in [f for f in sys.meta_path if f is not finder]:
        find = getattr(other, "find_spec", None)
        spec = find(name, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None
