"""Where ``ToolError`` and ``HelperGroup`` were defined before the child's code moved to
``app.runtime.child``: a snapshot pickled then (a variable holding a caught ``ToolError``) names
them here, and still loads."""

from __future__ import annotations

from app.runtime.child.namespace import HelperGroup, ToolError

__all__ = ["HelperGroup", "ToolError"]
